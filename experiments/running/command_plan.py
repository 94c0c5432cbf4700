"""``fedsketch run`` in two halves: one that validates (and needs torch), one that watches (and does not).

Validating an experiment builds its configs, and so imports every method's
module, and with it torch: about 300 MB that the command would otherwise hold
for the whole run beside Flower's own processes (docs/simulation.md,
"Memory"). So the command validates, writes what it found to a plan (each
run's settings as :meth:`RunConfig.to_mapping` gives them, the federation, the
plot switch) and, run as the program, replaces itself (``exec``, the same pid)
with ``python -m experiments.cli run-plan PLAN``, which starts and watches
Flower without importing torch (:func:`run_plan`), and draws the plots at the
end. Called as a function (tests, :func:`experiments.api.execute`), it goes on
in-process through the same plan. The command's module imports this one, never
the other way round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from experiments.flower.federation import Federation, default_backend

if TYPE_CHECKING:
    from experiments.running.stopping import Invocation
    from fedsketch.config import RunConfig
    from fedsketch.server.runlog import RunSpec

APP_DIR = Path(__file__).resolve().parents[2]
RUN_PLAN = "run-plan"
"""The internal command that runs what ``run`` validated (:func:`exec_run_plan`)."""
OUT = "runs"
"""Where results go unless told: ``--out``, and the Python API's ``out``."""
SUPERNODES = 2
"""The simulated nodes unless told: ``--supernodes`` of ``run`` and ``plan``, and the Python API's ``supernodes``."""


@dataclass(frozen=True)
class PlannedRun:
    """A validated run by its saved settings: what running and watching it reads (:class:`fedsketch.server.runlog.RunSpec`)."""

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
    from experiments.flower import spare

    fd, path = tempfile.mkstemp(prefix="fedsketch-plan-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(plan.to_json())
    spare.hand_over()  # the spare simulation process, if one was started, goes on with the same pid
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-c", _ENTRY, str(APP_DIR), RUN_PLAN, path])


def start_spare(backend: str | None, runtime: str) -> None:
    """Fork the first run's simulation process now, if runs go through one process (:mod:`experiments.flower.spare`)."""
    from experiments.flower.one_process import start_spare as fork_spare

    if runtime == "process":
        fork_spare(APP_DIR, backend or default_backend())


def run_plan_file(path: Path) -> int:
    """``run-plan PLAN``: the plan :func:`exec_run_plan` wrote, with the spare the first half started, if any."""
    from experiments.flower import spare

    spare.adopt()
    try:
        return run_plan(read_plan(path))
    finally:
        spare.release()


def read_plan(path: Path) -> Plan:
    """The plan :func:`exec_run_plan` wrote; the file is removed once read."""
    try:
        return Plan.from_json(path.read_text(encoding="utf-8"))
    finally:
        path.unlink(missing_ok=True)


def run_plan(validated: Plan) -> int:
    """Execute the plan's runs one by one with a progress display; then the outcomes, plots and report."""
    from experiments.flower import spare
    from experiments.flower.launch import simulate
    from experiments.running import runner, stopping
    from experiments.running.progress import RunWatcher, make_progress
    from fedsketch.server import runlog

    with stopping.Invocation("run") as invocation, make_progress() as progress:
        if (pid := spare.waiting_pid()) is not None:  # forked before the token existed: stopped by its pid
            invocation.track(pid)

        def execute(run: PlannedRun, path: Path) -> int:
            watcher = RunWatcher(progress, runner.describe(run), path, run.num_rounds)
            return simulate(
                APP_DIR, path / "run_config.toml", validated.federation, path, poll=stopping.checked(watcher)
            )

        results = runner.run_all(validated.runs, execute)
    return conclude(results, invocation, runlog.experiment_dir(validated.runs[0]), plot=validated.plot)


def conclude(results: Sequence[tuple[RunSpec, str]], invocation: Invocation, exp_dir: Path, plot: bool) -> int:
    """Print each run's outcome; draw the plots and write the report unless stopped; the exit code."""
    _print_outcomes(results)
    stop = invocation.stopped_by
    if stop is not None:
        print(
            f"fedsketch: stopped by {stop.cause}; what the runs measured is kept under {exp_dir} "
            f"(fedsketch plot / report {exp_dir}); a new `fedsketch run` restarts or resumes them"
        )
        return stop.exit_code
    if plot:
        _plot_and_report(exp_dir)
    return 1 if any(outcome.startswith("failed") for _, outcome in results) else 0


def _print_outcomes(results: Sequence[tuple[RunSpec, str]]) -> None:
    """One line per run; a failed run also gets the error its ``flower.log`` ends with."""
    from experiments.analysis.results import failed_replies, failure_reason
    from experiments.running.runner import describe
    from fedsketch.server import runlog

    for cfg, outcome in results:
        print(f"{describe(cfg):>24}: {outcome}  ({runlog.run_dir(cfg)})")
        reason = failure_reason(runlog.run_dir(cfg)) if outcome.startswith("failed") else ""
        for line in (reason, failed_replies(runlog.run_dir(cfg))):
            if line:
                print(f"{'':>24}  {line[:500]}")


def _plot_and_report(exp_dir: Path) -> None:
    from experiments.analysis.plots import plot_experiment
    from experiments.analysis.report import write_report

    if not any(exp_dir.rglob("metrics.jsonl")):
        print(f"no plots or report: no run under {exp_dir} has metrics")
        return
    for plot in plot_experiment(exp_dir):
        print(f"plot: {plot.path}")
    report, _ = write_report(exp_dir)
    print(f"report: {exp_dir / 'report.md'}")
    print(f"verdict: {report.verdict}")
