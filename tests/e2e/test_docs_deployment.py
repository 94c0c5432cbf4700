"""docs/deployment.md, "Try the kit on one machine", done as the page says it.

The commands are the page's own: every fenced block after an HTML comment
``<!-- try-it: NAME -->`` is run, in the page's order, by bash, with the
``settings`` block first (as the page asks in every terminal). A block marked
``runs until stopped; ready when it prints "TEXT"`` is started in its own
session (a terminal of its own) and waited for until its output shows TEXT;
the others must exit 0, and the ``run`` block is run twice, as an operator
repeating it would (the second resumes after the first's last checkpoint). The settings' defaults are preset to a temporary kit
folder, free ports, this checkout and this venv; ``HOME`` is a temporary
folder. At the end every started session gets Ctrl-C (SIGINT), and every
process carrying this test's tag in its environment is stopped.

"Your own CA, server certificate and keys" is done the same way: its
``<!-- own-pki: NAME -->`` blocks make a CA, a server certificate and SuperNode
keys with openssl and ssh-keygen and put them in the kit, right after the
trial's ``kit`` step; the trial then goes on as written.

This is FetchSGD's (Rothchild et al., ICML 2020) default job on two real
SuperNodes under the ClientApp launcher, with TLS and SuperNode authentication
from the kit's certificates, or from one's own.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_ssh_private_key, load_ssh_public_key

from experiments.flower import procs
from experiments.flower.app_files import stage_app
from experiments.flower.flower_procs import free_port
from experiments.flower.procs import processes_with_env

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"
TAG = "FEDSKETCH_DOCS_TEST"
MARKER = re.compile(
    r'<!-- (?P<flow>try-it|own-pki): (?P<name>[\w-]+)(?:; runs until stopped; ready when it prints "(?P<ready>[^"]+)")?'
    r" -->\n```bash\n(?P<code>.*?)```",
    re.DOTALL,
)
TWICE = ("run",)  # steps an operator may well repeat: they must give the same outcome


@dataclass(frozen=True)
class Step:
    """One marked block of the page."""

    name: str
    code: str
    ready: str | None  # None: a command that must exit 0; else a process that runs until stopped


def steps(text: str, flow: str = "try-it") -> list[Step]:
    """The page's marked blocks of ``flow``, in order."""
    return [Step(m["name"], m["code"], m["ready"]) for m in MARKER.finditer(text) if m["flow"] == flow]


def own_pki_trial(text: str) -> list[Step]:
    """The trial with the page's own-CA blocks right after its ``kit`` step."""
    trial = steps(text)
    at = [s.name for s in trial].index("kit") + 1
    return [*trial[:at], *steps(text, "own-pki"), *trial[at:]]


def test_the_page_marks_the_steps_a_newcomer_follows() -> None:
    text = DOC.read_text(encoding="utf-8")
    names = [s.name for s in steps(text)]
    assert names == ["settings", "kit", "superlink", "register", "device-0", "device-1", "list", "run", "results"]
    assert [s.name for s in steps(text, "own-pki")] == ["ca", "server-certificate", "supernode-keys", "install"]


@pytest.mark.slow
def test_the_kit_works_on_loopback_as_the_page_says(tmp_path: Path) -> None:
    outputs, logs = _follow(steps(DOC.read_text(encoding="utf-8")), tmp_path)
    rows = [json.loads(line) for line in outputs["results"].splitlines()]
    assert [r["round"] for r in rows] == [1, 2]  # the second run resumed after the last round: nothing more to do
    assert "resuming after round 2" in outputs["run"]
    assert all(r["clients"] == 2 and r["failures"] == 0 for r in rows)
    assert outputs["list"].count("online") >= 2
    for name, log in logs.items():  # every round's ClientApp was a fork of the launcher, not a fresh process
        if name.startswith("device"):
            assert re.search(r"launcher ready: SuperNode \d+ connected to the SuperLink", log)
    settings = tomllib.loads((tmp_path / "fedsketch-kit" / "admin" / "run_config.toml").read_text())
    assert (settings["experiment"], settings["num-rounds"], settings["sketch-cols"]) == ("default-kit", 2, 9000)


@pytest.mark.slow
def test_ones_own_ca_and_keys_made_with_openssl_work_on_loopback_as_the_page_says(tmp_path: Path) -> None:
    outputs, _ = _follow(own_pki_trial(DOC.read_text(encoding="utf-8")), tmp_path)
    rows = [json.loads(line) for line in outputs["results"].splitlines()]
    assert [(r["round"], r["clients"], r["failures"]) for r in rows] == [(1, 2, 0), (2, 2, 0)]
    kit = tmp_path / "fedsketch-kit"
    served = x509.load_pem_x509_certificate((kit / "server" / "server.pem").read_bytes())
    assert served.issuer.rfc4514_string() == "CN=My deployment CA"  # the SuperLink served ours, not the kit's
    for i in (0, 1):  # and the devices authenticated with ours
        assert (kit / "devices" / f"node-{i}" / f"node-{i}.pub").read_bytes() == (
            kit / "own" / f"node-{i}.pub"
        ).read_bytes()


@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("ssh-keygen")), reason="needs openssl and ssh-keygen")
def test_the_pages_openssl_commands_make_what_flower_needs(tmp_path: Path) -> None:
    """A CA, a server certificate naming 127.0.0.1 signed by it, and SuperNode keys Flower can load."""
    text = DOC.read_text(encoding="utf-8")
    settings, made = steps(text)[0], steps(text, "own-pki")[:3]
    env = _environment(tmp_path, run=False)
    for step in made:
        done = subprocess.run(
            ["bash", "-euc", settings.code + step.code],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"step {step.name} failed:\n{done.stdout}\n{done.stderr}"
    own = tmp_path / "fedsketch-kit" / "own"
    ca = x509.load_pem_x509_certificate((own / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((own / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    key = load_pem_private_key((own / "server.key").read_bytes(), None)
    assert key.public_key() == server.public_key()
    for i in (0, 1):
        private = load_ssh_private_key((own / f"node-{i}").read_bytes(), None)
        public = load_ssh_public_key((own / f"node-{i}.pub").read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
        assert private.public_key() == public
    # What the page says of openssl's own format: Flower's loader refuses it.
    subprocess.run(
        ["openssl", "ecparam", "-name", "secp384r1", "-genkey", "-noout", "-out", str(tmp_path / "pem")], check=True
    )
    with pytest.raises(ValueError):
        load_ssh_private_key((tmp_path / "pem").read_bytes(), None)


def _follow(page: list[Step], tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Do the page's steps; the output of each command, and the log of each process that runs until stopped."""
    settings, rest = page[0], page[1:]
    assert settings.name == "settings"
    env = _environment(tmp_path)
    started: list[tuple[Step, subprocess.Popen[bytes], Path]] = []
    outputs: dict[str, str] = {}
    try:
        for step in rest:
            script = settings.code + step.code
            if step.ready is None:
                for _ in range(2 if step.name in TWICE else 1):
                    done = subprocess.run(
                        ["bash", "-euc", script],
                        check=False,
                        cwd=tmp_path,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=600,
                    )
                    assert done.returncode == 0, (
                        f"step {step.name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
                    )
                    outputs[step.name] = done.stdout
                continue
            log = tmp_path / f"{step.name}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    ["bash", "-euc", script],
                    cwd=tmp_path,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append((step, proc, log))
            _wait_ready(step, proc, log, timeout=180.0)
        logs = {step.name: log.read_text(errors="replace") for step, _, log in started}
    finally:
        left = _stop(started, env[TAG])
    assert not left, f"processes started by the page's steps outlived Ctrl-C: {left}"
    return outputs, logs


def _environment(tmp_path: Path, run: bool = True) -> dict[str, str]:
    """The settings' defaults for this machine, and a tag that every started process inherits.

    For steps that ``run``, ``FEDSKETCH_SRC`` is a copy of this checkout's files that ``flwr run`` ships
    (:func:`stage_app`): the same FAB, without the walk through the virtual environment inside the checkout
    (docs/deployment.md)."""
    venv = Path(sys.executable).parent
    env = dict(os.environ)
    env.update(
        KIT=str(tmp_path / "fedsketch-kit"),
        FEDSKETCH_SRC=str(stage_app(ROOT, tmp_path / "checkout") if run else ROOT),
        PORT=str(free_port()),
        PORT0=str(free_port()),
        PORT1=str(free_port()),
        VIRTUAL_ENV=str(venv.parent),
        HOME=str(tmp_path / "home"),
        PATH=os.pathsep.join([str(venv), env.get("PATH", "")]),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        FLWR_DISABLE_UPDATE_CHECK="1",
    )
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
