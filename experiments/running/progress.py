"""A live progress display fed by the run's own ``metrics.jsonl`` and ``rounds.jsonl``.

Flower's and Ray's logs go to a file; the terminal shows one line per run:
round, test accuracy and bytes so far (``rich`` draws it: it handles terminal
width and redraw, which a hand-written bar would not). Accuracy and bytes are
the last evaluated round's (every ``eval-every`` rounds); a line for a later
round says which round they are from (``round 10/30  at round 5: acc 0.572
up 1.74 MB  down 3.4 MB``). When standard output is not a terminal (a log file, a CI log), ``rich`` would print nothing until the
end; :class:`LineProgress` prints a plain line instead when a run starts, at
its first round, every tenth of its rounds (or 30 s, whichever comes
first) and at its last round, flushed at once. From a run's second round on,
the line ends with an estimate of the time left: the pace of its rounds so far
(``rounds.jsonl`` stamps when each ended) times the rounds still to run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from experiments.analysis.results import format_bytes
from fedsketch.server import runlog


def make_progress(stream: TextIO | None = None) -> Progress | LineProgress:
    """The progress display used by ``fedsketch run`` and ``deploy``: live on a terminal, plain lines otherwise."""
    stream = stream if stream is not None else sys.stdout
    if not stream.isatty():
        return LineProgress(stream)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )


@dataclass
class _Task:
    label: str
    total: int
    started: float
    shown_round: int = 0
    shown_at: float = 0.0


class LineProgress:
    """The part of ``rich.progress.Progress`` that :class:`RunWatcher` uses, as plain lines.

    ``fetchsgd seed 0: round 20/200  acc 0.654  up 1.19 MB  down 3.4 MB  elapsed 0:02:05``
    """

    def __init__(
        self,
        stream: TextIO,
        lines_per_run: int = 10,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream, self.lines_per_run, self.every_s, self.clock = stream, lines_per_run, every_s, clock
        self.tasks: list[_Task] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def add_task(self, description: str, total: int, status: str = "") -> TaskID:
        """A new run: one line saying it starts."""
        now = self.clock()
        self.tasks.append(_Task(description, total, now))
        self._print(f"{description}: {status}")
        return TaskID(len(self.tasks) - 1)

    def update(self, task_id: TaskID, completed: int, status: str = "") -> None:
        """A line when the run reached a new round and it is time for one (see the module's docstring)."""
        task, now = self.tasks[task_id], self.clock()
        step = max(1, -(-task.total // self.lines_per_run))
        due = (
            task.shown_round == 0
            or completed >= task.total
            or completed - task.shown_round >= step
            or now - task.shown_at >= self.every_s
        )
        if completed > task.shown_round and due:
            task.shown_round, task.shown_at = completed, now
            self._print(f"{task.label}: round {completed}/{task.total}  {status}  elapsed {clock(now - task.started)}")

    def print(self, line: str) -> None:
        """A line of its own (:func:`note`)."""
        self._print(line)

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def measured(row: dict[str, float], shown: int) -> str:
    """The accuracy and bytes of the last evaluated round, ``row``, saying which round that is when the line shows
    a later one (``shown``): ``at round 5: acc 0.572  up 1.74 MB  down 3.4 MB``."""
    when = f"at round {row['round']}: " if row["round"] != shown else ""
    return (
        f"{when}acc {row['test_accuracy']:.3f}  up {format_bytes(row['cum_upload_bytes'])}"
        f"  down {format_bytes(row['cum_download_bytes'])}"
    )


def note(progress: Progress | LineProgress, line: str) -> None:
    """A line of its own above the progress display (as is on a terminal: ``rich`` would read ``[...]`` as markup)."""
    if isinstance(progress, LineProgress):
        progress.print(line)
    else:
        progress.console.print(line, markup=False, highlight=False)


def time_left(stamps: list[tuple[int, float]], num_rounds: int) -> float | None:
    """Seconds the run still needs at the pace of the rounds in ``stamps`` (round, when it ended), oldest first.

    ``None`` before two rounds have ended: the first round's own time includes Flower's start-up.
    """
    if len(stamps) < 2 or stamps[-1][0] <= stamps[0][0]:
        return None
    (first, start), (last, end) = stamps[0], stamps[-1]
    return (end - start) / (last - first) * max(0, num_rounds - last)


def clock(seconds: float) -> str:
    """``0:02:05``."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class RunWatcher:
    """Polls one run's ``metrics.jsonl`` and ``rounds.jsonl`` and updates its progress line.

    The line moves with every round that ended (the last one once it is evaluated); accuracy and bytes come from
    the last evaluated round, named when it is not the round shown (:func:`measured`), and the time left from the rounds that ended since the watcher started (a resumed
    run's earlier rounds do not count).
    """

    def __init__(
        self, progress: Progress | LineProgress, label: str, path: Path, num_rounds: int, started: float | None = None
    ) -> None:
        self.progress, self.path, self.num_rounds, self.label = progress, path, num_rounds, label
        self.started = started if started is not None else time.time()  # the rounds' stamps are unix times
        self.task: TaskID = progress.add_task(label, total=num_rounds, status="starting Flower...")
        self.resumed = False  # said that the run resumes from its checkpoint

    def __call__(self) -> None:
        if not self.resumed and (after := runlog.resumed_after(self.path)) is not None:
            self.resumed = True
            note(self.progress, f"{self.label}: resuming after round {after} (its checkpoint)")
        rows = runlog.read_metrics(self.path)
        rounds = runlog.read_metrics(self.path, runlog.ROUNDS)
        if not rows and not rounds:
            return
        evaluated = rows[-1]["round"] if rows else 0
        ended = rounds[-1]["round"] if rounds else 0
        # The last round is shown once it is evaluated: a line for it then carries the final accuracy.
        done = max(evaluated, ended if ended < self.num_rounds else 0)
        status = measured(rows[-1], done) if rows else ""
        stamps = [(r["round"], r["unix_time"]) for r in rounds if r.get("unix_time", 0) >= self.started]
        left = time_left(stamps, self.num_rounds)
        if left:
            status = f"{status}  about {clock(left)} left (estimate)".strip()
        if done:
            self.progress.update(self.task, completed=done, status=status)
