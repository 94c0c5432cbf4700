"""What a fedsketch deployment starts, and the Flower commands that start it.

A real federation runs one ``flower-superlink`` on a server and one
``flower-supernode`` per device, each told which data is its own with
``--node-config "partition-id=I num-partitions=N"``; the ServerApp then runs in
``client-assignment = "node"`` mode, one client per SuperNode. The commands,
the connection in ``$FLWR_HOME/config.toml`` and those run settings (rounds that
go on with a quorum of the nodes, and checkpoints) are built here once, for :class:`experiments.deployment.deploy.LocalFederation` on loopback and for
the kit :mod:`experiments.deployment.recipe` writes for real devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.runtime.supernode_waits import check_choice
from experiments.deployment.pki import ServerCertificates
from fedsketch.config import RunConfig
from fedsketch.settings.setting import ConfigError

CONNECTION = "fedsketch-deploy"
ISOLATIONS = ("launcher", "subprocess")
CHECKPOINT_EVERY = 5
DATABASE = "superlink.db"
"""The file that holds a SuperLink's state (Flower's ``--database``): in a kit's ``server/``, in a local federation's folder."""
"""Deployed runs checkpoint every this many rounds unless told otherwise: a lost server loses at most these."""


@dataclass(frozen=True)
class Deployment:
    """What to start: how many SuperNodes, and how the link is secured."""

    num_supernodes: int = 2
    tls: bool = False
    auth: bool = False
    isolation: str = "launcher"
    supernode_waits: str = "backoff"  # with the launcher; "flower": Flower's own 3 s idle wait

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"unknown isolation {self.isolation!r}; choose one of {', '.join(ISOLATIONS)}")
        check_choice(self.supernode_waits)
        if self.num_supernodes < 1:
            raise ValueError(f"a deployment needs at least one SuperNode; got {self.num_supernodes}")
        if self.auth and not self.tls:
            raise ValueError(
                "SuperNode authentication needs TLS: flower-superlink refuses "
                "--enable-supernode-auth together with --insecure"
            )


def quorum(num_supernodes: int) -> int:
    """The SuperNodes a deployed round waits for: a majority, so that devices lost for good do not stop the run."""
    return num_supernodes // 2 + 1


def node_settings(num_supernodes: int) -> dict[str, Any]:
    """Run settings for one client per SuperNode, every connected node in every round, a quorum of them needed."""
    n = num_supernodes
    return {"client-assignment": "node", "num-clients": n, "clients-per-round": n, "min-nodes": quorum(n)}


def checkpointed(runs: Sequence[RunConfig], every: int = CHECKPOINT_EVERY) -> tuple[RunConfig, ...]:
    """``runs``, each that does not checkpoint yet saving its server side every ``every`` rounds where it can.

    A deployed server can be lost (its machine, the SuperLink); with checkpoints the run resumes after the
    last one. Methods whose clients keep state on the devices cannot checkpoint (the config check refuses
    them: a restart would lose that state) and are left as they are.
    """
    out = []
    for cfg in runs:
        if not cfg.checkpoint_every:
            try:
                cfg = RunConfig.from_mapping({"checkpoint-every": every}, base=cfg)
            except ConfigError:
                pass
        out.append(cfg)
    return tuple(out)


def superlink_command(
    port: int, certs: ServerCertificates | None, auth: bool, host: str = "127.0.0.1", database: Path | None = None
) -> list[str]:
    """``flower-superlink`` serving its one HTTP endpoint (Fleet, Control, Runtime) on ``host:port``.

    With ``database``, its state (registered and online nodes, runs, messages) lives in that SQLite
    file instead of in memory, and a SuperLink started again on it knows every node it knew.
    """
    cmd = ["flower-superlink", "--disable-runtime-dependency-installation", "--host", host, "--port", str(port)]
    if database is not None:
        cmd += ["--database", str(database)]
    if certs is None:
        return [*cmd, "--insecure"]
    cmd += [
        "--ssl-ca-certfile",
        str(certs.ca_cert),
        "--ssl-certfile",
        str(certs.server_cert),
        "--ssl-keyfile",
        str(certs.server_key),
    ]
    return [*cmd, "--enable-supernode-auth"] if auth else cmd


def supernode_command(
    superlink: str,
    port: int,
    partition_id: int,
    num_partitions: int,
    ca_cert: Path | None,
    key: Path | None,
    isolation: str = "launcher",
    waits: str = "backoff",
) -> list[str]:
    """The command for one device; ``port`` is its local Runtime API (one per node on a host).

    With ``isolation = "launcher"``: ``python -m bridge.runtime.launcher --port PORT
    --supernode-waits WAITS -- flower-supernode ...`` (the launcher adds ``--isolation
    process`` and the port); with ``"subprocess"``: ``flower-supernode`` alone, Flower's default.
    """
    cmd = ["flower-supernode", "--superlink", superlink]
    cmd += ["--root-certificates", str(ca_cert)] if ca_cert is not None else ["--insecure"]
    if key is not None:
        cmd += ["--auth-supernode-private-key", str(key)]
    cmd += ["--node-config", f"partition-id={partition_id} num-partitions={num_partitions}"]
    if isolation == "launcher":
        launcher = ["python", "-m", "bridge.runtime.launcher", "--port", str(port), "--supernode-waits", waits]
        return [*launcher, "--", *cmd]
    return [*cmd, "--port", str(port)]


def connection_toml(address: str, ca_cert: Path | None) -> str:
    """``$FLWR_HOME/config.toml``: the connection ``flwr run`` and ``flwr supernode`` use."""
    security = f'root-certificates = "{ca_cert}"' if ca_cert is not None else "insecure = true"
    return f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{address}"\n{security}\n'
