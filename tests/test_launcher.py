"""clients/launcher.py: the SuperNode under a warm launcher that forks a ClientApp per message."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clients.forked import install_once
from clients.launcher import LauncherOptions, supernode_argv
from experiments.deploy import Deployment, LocalFederation, node_settings

ROOT = Path(__file__).resolve().parents[1]


def test_the_launcher_runs_the_supernode_with_process_isolation_on_its_port() -> None:
    argv = supernode_argv(["flower-supernode", "--insecure", "--superlink", "h:1"], LauncherOptions(port=9200))
    assert argv == ["flower-supernode", "--insecure", "--superlink", "h:1", "--isolation", "process",
                    "--host", "127.0.0.1", "--port", "9200"]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ([], "flower-supernode --superlink"),
        (["flwr-clientapp"], "flower-supernode --superlink"),
        (["flower-supernode", "--port", "9"], "remove ['--port']"),
        (["flower-supernode", "--isolation=subprocess"], "remove ['--isolation=subprocess']"),
    ],
)
def test_a_command_the_launcher_cannot_run_is_refused_with_the_reason(command: list[str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        supernode_argv(command, LauncherOptions())
    done = subprocess.run([sys.executable, "-m", "clients.launcher", "--", *command], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and reason in done.stderr and "Traceback" not in done.stderr


def test_bad_launcher_options_are_refused() -> None:
    with pytest.raises(ValueError, match="--poll-s"):
        LauncherOptions(poll_s=0)
    with pytest.raises(ValueError, match="--port"):
        LauncherOptions(port=70000)


def test_a_fab_is_extracted_once_for_the_same_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    calls: list[bytes] = []

    def flower_install(fab: bytes, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:
        calls.append(fab)
        (folder := tmp_path / f"app-{len(calls)}").mkdir()
        return folder

    install = install_once(flower_install)
    first = install(b"fab one", skip_prompt=True)
    assert install(b"fab one", skip_prompt=True) == first and calls == [b"fab one"]
    assert install(b"fab two", skip_prompt=True) != first and len(calls) == 2
    shutil.rmtree(first)  # removed from disk: extracted again
    assert install(b"fab one", skip_prompt=True).is_dir() and len(calls) == 3


@pytest.mark.slow
def test_each_round_runs_the_runs_own_clientapp_code_in_a_fork(tmp_path: Path) -> None:
    """The FAB's code, not the copy the launcher was started from, answers; no flower-superexec runs."""
    app = tmp_path / "app"
    for part in ("clients", "fedsketch", "strategies", "experiments"):
        shutil.copytree(ROOT / part, app / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", app / "pyproject.toml")
    with open(app / "clients" / "client_app.py", "a", encoding="utf-8") as f:
        f.write('\nimport os as _os, pathlib as _p\n_p.Path(_os.environ["FLWR_HOME"], "from-the-fab").touch()\n')
    settings = {**node_settings(1), "num-rounds": 2, "eval-every": 2, "out-dir": str(tmp_path / "runs")}
    (tmp_path / "run.toml").write_text("".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in settings.items()))
    with LocalFederation(Deployment(1), tmp_path / "fed") as fed:
        launcher = fed.procs["supernode-0"]
        assert fed.run(app, tmp_path / "run.toml", tmp_path / "flower.log") == 0
        log = fed.log("supernode-0").read_text(errors="replace")
        assert launcher.poll() is None  # the launcher outlives its tasks
    assert (tmp_path / "fed" / "nodes" / "node-0" / "from-the-fab").exists()
    assert "launcher ready" in log and log.count("Sent successfully") == 2
    assert "Starting Flower SuperExec" not in log  # Flower's per-message launcher never started
