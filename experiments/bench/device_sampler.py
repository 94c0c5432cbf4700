"""Sample one device's process tree: memory (PSS, RSS), ClientApp lifetimes, round times from its log.

Used by ``experiments/bench/bench_device.py`` to measure what a SuperNode costs a
device per round of FetchSGD (Rothchild et al., ICML 2020) or any other
method. A thread walks the tree below one root process
(``/proc/PID/task/*/children``) every ``interval`` seconds and reads each
process's ``/proc/PID/smaps_rollup``; PSS splits pages shared between
processes (a fork's, the Python runtime's) among them, so the sum over the
tree counts each page once. Processes that live shorter than the interval
can be missed: ClientApps live a second or more.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

TASK_NAME = "flwr-clientapp"  # the process name of Flower's per-message ClientApp and of a launcher's fork


class DeviceSampler(threading.Thread):
    """Peak and idle memory of the tree under ``root``; the times of the SuperNode's log lines."""

    def __init__(self, root: int, log_file: Path, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.root, self.log_file, self.interval = root, log_file, interval
        self.peak_pss = self.peak_rss = 0
        self.idle: list[int] = []  # PSS sums while no ClientApp runs
        self.lifetimes: dict[int, list[float]] = {}  # task pid -> [first seen, last seen]
        self.lines: list[tuple[float, str]] = []
        self._stop_event = threading.Event()
        self._offset = 0

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = time.monotonic()
            self._sample(now)
            self._read_log(now)
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        """Stop sampling (after one last look at the log)."""
        self._stop_event.set()
        self.join()
        self._read_log(time.monotonic())

    def wait_for(self, text: str, timeout: float) -> None:
        """Wait until a log line contains ``text``.

        Raises
        ------
        RuntimeError
            If none does within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for _, line in self.lines):
                return
            time.sleep(0.1)
        raise RuntimeError(f"no line with {text!r} in {self.log_file} after {timeout:.0f} s")

    @property
    def idle_pss(self) -> int:
        """Median PSS sum while no ClientApp ran (0 if never seen)."""
        return sorted(self.idle)[len(self.idle) // 2] if self.idle else 0

    def round_seconds(self) -> list[float]:
        """Per message: from the SuperNode's "Receiving" line to its next "Sent successfully" line."""
        out, start = [], None
        for t, line in self.lines:
            if "Receiving:" in line:
                start = t
            elif "Sent successfully" in line and start is not None:
                out.append(t - start)
                start = None
        return out

    def task_lifetimes(self) -> list[float]:
        """How long each ClientApp process was seen alive."""
        return [last - first for first, last in self.lifetimes.values()]

    def _sample(self, now: float) -> None:
        pss = rss = 0
        tasks = False
        for pid in _tree(self.root):
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:  # it exited between the walk and the read
                continue
            fields = dict(line.split(":", 1) for line in rollup.splitlines()[1:])
            pss += int(fields["Pss"].split()[0]) * 1024
            rss += int(fields["Rss"].split()[0]) * 1024
            if name == TASK_NAME:
                tasks = True
                self.lifetimes.setdefault(pid, [now, now])[1] = now
        self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
        if pss and not tasks:
            self.idle.append(pss)

    def _read_log(self, now: float) -> None:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only
        self._offset += end
        self.lines += [(now, line) for line in data[:end].decode(errors="replace").splitlines()]


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants that are alive now."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:  # a process may exit while we look
            for children in Path(f"/proc/{pid}/task").glob("*/children"):
                todo += [int(c) for c in children.read_text().split()]
        except OSError:
            continue
    return found
