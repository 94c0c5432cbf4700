"""docs/deployment.md, "Try the kit on one machine", done as the page says it.

The commands are the page's own: every fenced block after an HTML comment
``<!-- try-it: NAME -->`` is run, in the page's order, by bash, with the
``settings`` block first (as the page asks in every terminal). A block marked
``runs until stopped; ready when it prints "TEXT"`` is started in its own
session (a terminal of its own) and waited for until its output shows TEXT;
the others must exit 0. The settings' defaults are preset to a temporary kit
folder, free ports, this checkout and this venv; ``HOME`` is a temporary
folder. At the end every started session gets Ctrl-C (SIGINT), and every
process carrying this test's tag in its environment is stopped.

This is FetchSGD's (Rothchild et al., ICML 2020) default job on two real
SuperNodes under the ClientApp launcher, with TLS and SuperNode authentication
from the kit's certificates.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from experiments import procs
from experiments.launch import free_port
from experiments.procs import processes_with_env

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "deployment.md"
TAG = "FEDSKETCH_DOCS_TEST"
MARKER = re.compile(
    r'<!-- try-it: (?P<name>[\w-]+)(?:; runs until stopped; ready when it prints "(?P<ready>[^"]+)")? -->\n'
    r"```bash\n(?P<code>.*?)```",
    re.DOTALL,
)


@dataclass(frozen=True)
class Step:
    """One marked block of the page."""

    name: str
    code: str
    ready: str | None  # None: a command that must exit 0; else a process that runs until stopped


def steps(text: str) -> list[Step]:
    """The page's marked blocks, in order."""
    return [Step(m["name"], m["code"], m["ready"]) for m in MARKER.finditer(text)]


def test_the_page_marks_the_steps_a_newcomer_follows() -> None:
    names = [s.name for s in steps(DOC.read_text(encoding="utf-8"))]
    assert names == ["settings", "kit", "superlink", "register", "device-0", "device-1", "list", "run", "results"]


@pytest.mark.slow
def test_the_kit_works_on_loopback_as_the_page_says(tmp_path: Path) -> None:
    page = steps(DOC.read_text(encoding="utf-8"))
    settings, rest = page[0], page[1:]
    assert settings.name == "settings"
    env = _environment(tmp_path)
    started: list[tuple[Step, subprocess.Popen[bytes], Path]] = []
    outputs: dict[str, str] = {}
    try:
        for step in rest:
            script = settings.code + step.code
            if step.ready is None:
                done = subprocess.run(["bash", "-euc", script], check=False, cwd=tmp_path, env=env, capture_output=True,
                                      text=True, timeout=600)  # fmt: skip
                assert done.returncode == 0, (
                    f"step {step.name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
                )
                outputs[step.name] = done.stdout
                continue
            log = tmp_path / f"{step.name}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(["bash", "-euc", script], cwd=tmp_path, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            started.append((step, proc, log))
            _wait_ready(step, proc, log, timeout=180.0)
        rows = [json.loads(line) for line in outputs["results"].splitlines()]
        assert [r["round"] for r in rows] == [1, 2]
        assert all(r["clients"] == 2 and r["failures"] == 0 for r in rows)
        assert outputs["list"].count("online") >= 2
        # Every round's ClientApp was a fork of the launcher, not a fresh process.
        for step, _, log in started:
            if step.name.startswith("device"):
                assert "launcher ready" in log.read_text(errors="replace")
    finally:
        left = _stop(started, env[TAG])
    assert not left, f"processes started by the page's steps outlived Ctrl-C: {left}"


def _environment(tmp_path: Path) -> dict[str, str]:
    """The settings' defaults for this machine, and a tag that every started process inherits."""
    venv = Path(sys.executable).parent
    env = dict(os.environ)
    env.update(
        KIT=str(tmp_path / "fedsketch-kit"), FEDSKETCH_SRC=str(ROOT), PORT=str(free_port()),
        PORT0=str(free_port()), PORT1=str(free_port()), VIRTUAL_ENV=str(venv.parent), HOME=str(tmp_path / "home"),
        PATH=os.pathsep.join([str(venv), env.get("PATH", "")]), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
        FLWR_DISABLE_UPDATE_CHECK="1",
    )  # fmt: skip
    env[TAG] = str(tmp_path)
    env.pop("FLWR_HOME", None)
    (tmp_path / "home").mkdir()
    return env


def _wait_ready(step: Step, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if step.ready is not None and step.ready in text:
            return
        if proc.poll() is not None:
            pytest.fail(f"step {step.name} exited ({proc.returncode}) before printing {step.ready!r}:\n{text[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"step {step.name} did not print {step.ready!r} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(started: list[tuple[Step, subprocess.Popen[bytes], Path]], tag_value: str) -> list[str]:
    """Ctrl-C in every terminal, devices first; then stop whatever is left, and say what that was."""
    for _, proc, _ in reversed(started):
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    for _, proc, _ in started:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 15
    while processes_with_env(TAG, tag_value) and time.monotonic() < deadline:  # detached helpers exit on their own
        time.sleep(0.5)
    left = [_describe(pid) for pid in processes_with_env(TAG, tag_value)]
    procs.stop_carrying(TAG, tag_value, 5.0)
    return left


def _describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmdline = ""
    return f"{pid} {cmdline[:120]}"
