"""``fedsketch run`` in two halves: one that validates (and needs torch), one that watches (and does not).

Validating an experiment builds its configs, and so imports every method's
module, and with it torch: about 300 MB that the command would otherwise hold
for the whole run beside Flower's own processes (docs/simulation.md,
"Memory"). So the command validates, writes what it found to a plan (each
run's settings as :meth:`RunConfig.to_mapping` gives them, the federation, the
plot switch) and, run as the program, replaces itself (``exec``, the same pid)
with ``python -m experiments.cli run-plan PLAN``, which starts and watches
Flower without importing torch, and draws the plots at the end. Called as a
function (tests), it goes on in-process through the same plan.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from experiments.launch import Federation

if TYPE_CHECKING:
    from fedsketch.config import RunConfig


@dataclass(frozen=True)
class PlannedRun:
    """A validated run by its saved settings: what running and watching it reads (:class:`fedsketch.runlog.RunSpec`)."""

    settings: dict[str, Any]

    @property
    def experiment(self) -> str:
        return str(self.settings["experiment"])

    @property
    def out_dir(self) -> str:
        return str(self.settings["out-dir"])

    @property
    def strategy(self) -> str:
        return str(self.settings["strategy"])

    @property
    def seed(self) -> int:
        return int(self.settings["seed"])

    @property
    def num_rounds(self) -> int:
        return int(self.settings["num-rounds"])

    @property
    def checkpoint_every(self) -> int:
        return int(self.settings["checkpoint-every"])

    def to_mapping(self) -> dict[str, Any]:
        return dict(self.settings)


@dataclass(frozen=True)
class Plan:
    """Every run of one ``fedsketch run``, validated; the federation they run on; whether to plot at the end."""

    runs: tuple[PlannedRun, ...]
    federation: Federation
    plot: bool

    @classmethod
    def of(cls, runs: Iterable[RunConfig], federation: Federation, plot: bool) -> Plan:
        return cls(tuple(PlannedRun(cfg.to_mapping()) for cfg in runs), federation, plot)

    def to_json(self) -> str:
        runs = [run.settings for run in self.runs]
        return json.dumps({"runs": runs, "federation": dataclasses.asdict(self.federation), "plot": self.plot})

    @classmethod
    def from_json(cls, text: str) -> Plan:
        doc = json.loads(text)
        return cls(tuple(PlannedRun(s) for s in doc["runs"]), Federation(**doc["federation"]), bool(doc["plot"]))


_ENTRY = "import sys; sys.path.insert(0, sys.argv.pop(1)); from experiments.cli import main; sys.exit(main())"
"""The CLI of this very checkout (its folder first on the path), whatever the working directory holds."""


def exec_run_plan(plan: Plan) -> NoReturn:
    """Write ``plan`` to a file and replace this process with ``fedsketch run-plan FILE`` (same pid)."""
    fd, path = tempfile.mkstemp(prefix="fedsketch-plan-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(plan.to_json())
    sys.stdout.flush()
    sys.stderr.flush()
    from experiments.cli import APP_DIR, RUN_PLAN

    os.execv(sys.executable, [sys.executable, "-c", _ENTRY, str(APP_DIR), RUN_PLAN, path])


def read_plan(path: Path) -> Plan:
    """The plan :func:`exec_run_plan` wrote; the file is removed once read."""
    try:
        return Plan.from_json(path.read_text(encoding="utf-8"))
    finally:
        path.unlink(missing_ok=True)
