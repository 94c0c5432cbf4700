"""What to run on the server and on each device of a real fedsketch deployment.

:func:`write_kit` makes the certificates (a CA and a server certificate for the
server's address), one SuperNode key pair per device, the ``flwr`` connection
and run config for the operator, and per device a start script and a systemd
unit; it returns the step-by-step instructions. The commands are built by the
same functions :class:`experiments.deployment.deploy.LocalFederation` runs on loopback in
the tests, so what is printed is what is tested.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.deployment.deploy_commands import (
    CONNECTION,
    DATABASE,
    checkpointed,
    connection_toml,
    node_settings,
    superlink_command,
    supernode_command,
)
from experiments.deployment.pki import ServerCertificates, make_certificates, make_node_keys
from experiments.flower.app_files import ships
from experiments.running.command_plan import APP_DIR
from experiments.running.runner import DEFAULT_CONFIG, load_experiment, run_config_toml
from fedsketch.server import runlog

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

DEFAULT_PORT = 8000  # flower-superlink's default
SUPERNODE_PORT = 9094  # flower-supernode's default local ClientApp API port
INSTALL_DIR = "/opt/fedsketch"
PORT_VARIABLE = "FEDSKETCH_RUNTIME_PORT"  # supernode.sh reads its local Runtime API port from it
KIT_SUFFIX = "-kit"  # a kit's experiment is its file's, renamed: never the folder of a `fedsketch deploy` run


def kit_runs(
    num_devices: int,
    experiment_file: Path = DEFAULT_CONFIG,
    overrides: Mapping[str, Any] | None = None,
    strategies: list[str] | None = None,
    seeds: int | None = None,
    out_dir: str = "runs",
) -> tuple[RunConfig, ...]:
    """The runs of ``experiment_file`` as a kit's devices run them: one client per SuperNode.

    Settings come in the order ``fedsketch deploy`` applies them: the file, one
    client per SuperNode, then ``overrides``; then checkpoints (:func:`checkpointed`) unless ``overrides``
    set ``checkpoint-every``. The experiment is named
    ``NAME-kit`` unless ``overrides`` names one, and ``out_dir`` stays relative:
    the SuperLink's ServerApp writes under the folder the SuperLink runs in.

    Raises
    ------
    ConfigError
        For a setting the experiment's runs refuse.
    """
    given = dict(overrides or {})
    values = {**node_settings(num_devices), "out-dir": out_dir, **given}
    if "experiment" not in given:
        first = load_experiment(experiment_file, values, 1, strategies).runs[0]
        values["experiment"] = runlog.experiment_name(first) + KIT_SUFFIX
    runs = load_experiment(experiment_file, values, seeds, strategies).runs
    return runs if "checkpoint-every" in given else checkpointed(runs)


def write_kit(
    folder: Path, server: str, num_devices: int, port: int = DEFAULT_PORT, runs: Sequence[RunConfig] = ()
) -> str:
    """Write a deployment kit into ``folder`` and return the instructions.

    ``server`` is the host name or IP address devices use to reach the SuperLink;
    the server certificate names it (and 127.0.0.1, which the SuperLink's own
    helper process dials). ``runs`` (default: :func:`kit_runs` of the default
    experiment) get one run config file each in ``admin/``: every setting, so
    that ``flwr run`` runs exactly them and never pyproject's defaults.

    Raises
    ------
    ValueError
        If ``num_devices`` < 1, or ``folder`` is no place for a kit (:func:`check_kit_folder`).
    """
    if num_devices < 1:
        raise ValueError(f"a deployment needs at least one device; got {num_devices}")
    folder = folder.resolve()
    check_kit_folder(folder)
    certs = make_certificates(folder / "server", hosts=(server, "127.0.0.1", "localhost"))
    (folder / "server" / "ca.key").rename(folder / "ca.key")  # signs certificates: keep it off the server
    admin = folder / "admin"
    admin.mkdir()
    (admin / "config.toml").write_text(connection_toml(f"{server}:{port}", certs.ca_cert), encoding="utf-8")
    files = {run_config_name(cfg, first=i == 0): cfg for i, cfg in enumerate(runs or kit_runs(num_devices))}
    for name, cfg in files.items():
        (admin / name).write_text(run_config_toml(cfg), encoding="utf-8")
    for i in range(num_devices):
        _write_device(folder / "devices" / f"node-{i}", certs, server, port, i, num_devices)
    text = _instructions(folder, certs, server, port, num_devices, files)
    (folder / "INSTRUCTIONS.txt").write_text(text, encoding="utf-8")
    return text


def check_kit_folder(folder: Path, app_dir: Path = APP_DIR) -> None:
    """A kit goes into a new or empty folder that ``flwr run`` of the app does not ship.

    Raises
    ------
    ValueError
        If ``folder`` is a file, holds anything (a kit's keys are never overwritten), or lies in
        ``app_dir`` where its ``.gitignore`` does not exclude it: each ``flwr run`` would send the
        kit's keys and, run after run, the apps the devices installed (until Flower refuses the
        FAB's depth).
    """
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; a kit needs a new or empty folder")
    if folder.is_dir() and any(folder.iterdir()):
        held = "already holds a kit" if (folder / "server").exists() else "is not empty"
        raise ValueError(f"{folder} {held}; choose an empty folder (keys are never overwritten)")
    if ships(app_dir, folder):
        raise ValueError(
            f"{folder} is inside the app folder {app_dir}, which flwr run ships: choose a folder "
            "outside it (e.g. ~/fedsketch-kit), or one its .gitignore excludes (fedsketch-kit/)"
        )


def run_config_name(cfg: RunConfig, first: bool) -> str:
    """``run_config.toml`` for the first run; ``run_config.fedavg.toml``, ``run_config.fetchsgd.seed1.toml``, ..."""
    if first:
        return "run_config.toml"
    return ".".join(["run_config", *runlog.run_dir(cfg).relative_to(runlog.experiment_dir(cfg)).parts, "toml"])


def _write_device(folder: Path, certs: ServerCertificates, server: str, port: int, i: int, n: int) -> None:
    keys = make_node_keys(folder, f"node-{i}")
    shutil.copy(certs.ca_cert, folder / "ca.crt")
    cmd = supernode_command(f"{server}:{port}", SUPERNODE_PORT, i, n, Path("ca.crt"), Path(keys.private.name))
    # The local Runtime API port can be changed (two SuperNodes on one host need two).
    line = shlex.join(cmd).replace(f"--port {SUPERNODE_PORT}", f'--port "${{{PORT_VARIABLE}:-{SUPERNODE_PORT}}}"')
    script = folder / "supernode.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"# fedsketch SuperNode {i} of {n}, under the ClientApp launcher (a fork per round; docs/deployment.md).\n"
        "# Needs a venv with torch, flwr and fedsketch (FEDSKETCH_VENV, default below).\n"
        "# It retries while the link is down; once joined, the launcher starts the SuperNode again whenever it exits.\n"
        "# Refused at its first start (after a crash, Flower 1.42 refuses the node until its old session times out,\n"
        "# up to a minute), it exits: run it under a supervisor (systemd unit beside).\n"
        'set -eu\ncd "$(dirname "$0")"\n'
        f'export PATH="${{FEDSKETCH_VENV:-{INSTALL_DIR}/venv}}/bin:$PATH"\n'
        'export FLWR_HOME="${FLWR_HOME:-$HOME/.flwr}" FLWR_TELEMETRY_ENABLED=0\n'
        f"exec {line}\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    home = f"{INSTALL_DIR}/node-{i}"
    (folder / "fedsketch-supernode.service").write_text(
        f"[Unit]\nDescription=fedsketch Flower SuperNode {i} of {n}\n"
        "After=network-online.target\nWants=network-online.target\n\n"
        f"[Service]\nUser=fedsketch\nWorkingDirectory={home}\n"
        f"Environment=FLWR_HOME={home}/flwr-home\nEnvironment=FLWR_TELEMETRY_ENABLED=0\n"
        f"ExecStart={INSTALL_DIR}/venv/bin/{shlex.join(cmd)}\n"
        "Restart=always\nRestartSec=10\n\n[Install]\nWantedBy=multi-user.target\n",
        encoding="utf-8",
    )


def _instructions(
    folder: Path, certs: ServerCertificates, server: str, port: int, n: int, files: Mapping[str, RunConfig]
) -> str:
    rel = ServerCertificates(*(Path("server") / p.name for p in (certs.ca_cert, certs.server_cert, certs.server_key)))
    link = shlex.join(superlink_command(port, rel, auth=True, host="0.0.0.0", database=Path("server") / DATABASE))
    register = "\n".join(f"flwr supernode register devices/node-{i}/node-{i}.pub {CONNECTION}" for i in range(n))
    runs = "\n".join(
        f"     admin/{name}: {cfg.strategy}, {cfg.num_rounds} rounds -> {runlog.run_dir(cfg)}/metrics.jsonl"
        for name, cfg in files.items()
    )
    device_0 = shlex.join(supernode_command(f"{server}:{port}", SUPERNODE_PORT, 0, n, Path("ca.crt"), Path("node-0")))
    return f"""\
fedsketch deployment kit in {folder}: 1 SuperLink at {server}:{port}, {n} SuperNode(s), TLS and SuperNode auth.
Keep {folder / "ca.key"} offline: it signs server certificates and is needed on no machine.

1. Server ({server}): copy server/ (ca.crt, server.pem, server.key), install fedsketch
   (pip install PATH/TO/fedsketch), open TCP port {port}, then in the folder holding server/:

   export FLWR_TELEMETRY_ENABLED=0
   {link}

   Metrics go to runs/<experiment>/<strategy>/metrics.jsonl under the folder it was started in.
   Its state (registered devices, runs) is kept in server/{DATABASE}: started again with the same
   command after a crash or a reboot, it knows every device, and the devices carry on by themselves.

2. Operator (any machine with fedsketch installed that reaches {server}:{port}; the server will do):
   in this kit's folder, register every device's public key, then start a run.

   export FLWR_HOME={folder / "admin"}
   {register.replace(chr(10), chr(10) + "   ")}
   flwr supernode list {CONNECTION}
   flwr run PATH/TO/fedsketch {CONNECTION} --stream --run-config {folder / "admin" / "run_config.toml"}

   Each run config holds every setting of one run (one client per SuperNode), and its results' folder:
{runs}
   Change a setting by editing its line. The app's code travels with each run;
   devices need only its dependencies. A round goes on with a majority of the devices
   (min-nodes); the server saves a checkpoint every few rounds (checkpoint-every): the same
   flwr run again resumes after the last one (a finished run does nothing; delete its folder
   to run it afresh).

3. Device i (i = 0..{n - 1}): copy devices/node-i/ to {INSTALL_DIR}/node-i, make {INSTALL_DIR}/venv with a
   CPU-only torch, flwr and fedsketch (docs/deployment.md, "Setting up a device"), then either run it by hand:

   {INSTALL_DIR}/node-i/supernode.sh

   or as a service that restarts after crashes and reboots (after a crash the SuperLink refuses the
   node until its old session times out, up to a minute; the service keeps retrying every 10 s):

   sudo useradd --system fedsketch && sudo chown -R fedsketch {INSTALL_DIR}/node-i
   sudo cp {INSTALL_DIR}/node-i/fedsketch-supernode.service /etc/systemd/system/
   sudo systemctl daemon-reload && sudo systemctl enable --now fedsketch-supernode

   It prints "launcher ready" once the SuperLink has accepted it. Device 0 runs: {device_0}
   Its private key (node-i) never leaves the device; a node whose key is not registered is refused,
   and the device then says where the reason is and how to fix it.
"""
