"""An experiment small enough to run for real in the fast tier: two rounds of four generated clients' data."""

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
