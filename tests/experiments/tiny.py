"""An experiment small enough to run for real in the fast tier: two rounds of four generated clients' data;
and a plan's rows, to compare plans."""

from __future__ import annotations

from pathlib import Path

TINY = """\
[run]
experiment = "tiny"
dataset = "synthetic"
model = "mlp"
model-hidden = 16
num-clients = 4
clients-per-round = 2
num-rounds = 2
eval-every = 1
local-batch-size = 8
samples-per-client = 16
sketch-rows = 1
sketch-cols = 50
k = 10

[compare]
strategies = ["fedavg"]
"""


def tiny(folder: Path, text: str = TINY) -> Path:
    """The experiment file, written into ``folder``."""
    path = folder / "tiny.toml"
    path.write_text(text, encoding="utf-8")
    return path


def plan_rows(plan: str) -> list[str]:
    """The rows of bytes of a plan as ``fedsketch plan`` prints it, without the line that says how long round 1 took."""
    return plan[: plan.index("Round 1 of each run")].splitlines()
