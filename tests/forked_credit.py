"""What a fork made by a test runs, credited to that test when mutmut records which tests reach which function.

mutmut's ``stats`` pass (``MUTANT_UNDER_TEST=stats``) records a function as reached by the test running in the
same process only; code that runs in a fork (the spare after ``os.fork``: ``experiments/flower/spare_child.py``)
would be reached by no test, and its mutants never tried. The fork calls :meth:`Credit.send` once it has run
what matters, the test calls :meth:`Credit.receive`, which adds the fork's record to its own
(``mutmut.state.state()._stats``, mutmut 3.8). Outside that pass both do nothing.
"""

from __future__ import annotations

import os
import select
import time


def recording() -> bool:
    """Whether mutmut is recording which functions the running test reaches."""
    return os.environ.get("MUTANT_UNDER_TEST") == "stats"


class Credit:
    """A pipe from a fork to the test that made it; make it before the fork."""

    def __init__(self) -> None:
        self.fds = os.pipe() if recording() else None

    def send(self) -> None:
        """In the fork: the functions mutmut recorded there, to the test."""
        if self.fds is not None:
            from mutmut.state import state

            os.write(self.fds[1], "\n".join([*sorted(state()._stats), ""]).encode() + b"\0")

    def receive(self, timeout_s: float = 30.0) -> None:
        """In the test: what the fork sent, added to the test's record (nothing more once ``timeout_s`` is over)."""
        if self.fds is None:
            return
        from mutmut.state import state

        read, write = self.fds
        os.close(write)
        data, deadline = b"", time.monotonic() + timeout_s
        while not data.endswith(b"\0") and select.select([read], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(read, 65536)
            if not chunk:
                break
            data += chunk
        os.close(read)
        state()._stats.update(name for name in data.rstrip(b"\0").decode().split("\n") if name)
