"""What a deployment starts and the commands that start it (experiments/deployment/deploy_commands.py).

The deployment itself (a SuperLink and SuperNodes on loopback) is in tests/e2e/test_deploy.py; the runs'
settings a deployment decides, in tests/experiments/test_cli.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bridge import flower
from experiments.cli import main
from experiments.deployment import deploy_commands
from experiments.deployment.deploy_commands import Deployment
from experiments.deployment.pki import ServerCertificates
from tests.experiments.tiny import tiny


def test_a_deployment_that_cannot_start_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["deploy", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "2"]
    assert main([*args, "--auth"]) == 2
    assert capsys.readouterr().err == (
        "fedsketch: error: SuperNode authentication needs TLS: flower-superlink refuses "
        "--enable-supernode-auth together with --insecure\n"
    )
    assert main([*args, "--set", "num-rounds=0"]) == 2
    assert "num-rounds" in capsys.readouterr().err
    monkeypatch.setenv(flower.SWITCH, "1")
    assert main([*args, "--auth"]) == 2
    assert capsys.readouterr().out == (
        f"fedsketch: SuperNodes run Flower's own isolation, not the launcher ({flower.SWITCH} is set)\n"
    )
    assert not (tmp_path / "runs").exists()


def test_a_deployment_of_one_node_or_more_with_a_known_isolation_is_accepted() -> None:
    assert Deployment(1).num_supernodes == 1
    with pytest.raises(ValueError, match=r"^a deployment needs at least one SuperNode; got 0$"):
        Deployment(0)
    with pytest.raises(ValueError, match=r"^unknown isolation 'threads'; choose one of launcher, subprocess$"):
        Deployment(2, isolation="threads")


def test_the_superlinks_command_serves_tls_auth_and_its_database_as_asked(tmp_path: Path) -> None:
    base = ["flower-superlink", "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", "9092"]
    assert deploy_commands.superlink_command(9092, None, auth=False) == [*base, "--insecure"]
    db = tmp_path / "link.db"
    assert deploy_commands.superlink_command(9092, None, False, database=db) == [
        *base,
        "--database",
        str(db),
        "--insecure",
    ]
    certs = ServerCertificates(tmp_path / "ca.crt", tmp_path / "server.pem", tmp_path / "server.key")
    tls = ["--ssl-ca-certfile", str(certs.ca_cert), "--ssl-certfile", str(certs.server_cert)]
    tls += ["--ssl-keyfile", str(certs.server_key)]
    assert deploy_commands.superlink_command(9092, certs, auth=False) == [*base, *tls]
    assert deploy_commands.superlink_command(9092, certs, auth=True) == [*base, *tls, "--enable-supernode-auth"]
    outside = deploy_commands.superlink_command(8000, certs, auth=True, host="0.0.0.0")
    assert outside[2:6] == ["--host", "0.0.0.0", "--port", "8000"]


def test_a_supernodes_command_runs_under_the_launcher_or_alone(tmp_path: Path) -> None:
    node = ["flower-supernode", "--superlink", "10.0.0.1:9092"]
    config = ["--node-config", "partition-id=2 num-partitions=5"]
    alone = deploy_commands.supernode_command("10.0.0.1:9092", 9095, 2, 5, None, None, isolation="subprocess")
    assert alone == [*node, "--insecure", *config, "--port", "9095"]
    ca, key = tmp_path / "ca.crt", tmp_path / "node-2"
    launched = deploy_commands.supernode_command("10.0.0.1:9092", 9095, 2, 5, ca, key, waits="flower")
    launcher = ["python", "-m", "bridge.runtime.launcher", "--port", "9095", "--supernode-waits", "flower", "--"]
    assert launched == [
        *launcher,
        *node,
        "--root-certificates",
        str(ca),
        "--auth-supernode-private-key",
        str(key),
        *config,
    ]
    default = deploy_commands.supernode_command("10.0.0.1:9092", 9095, 2, 5, ca, None)
    assert default[:8] == [*launcher[:6], "backoff", "--"] and "--auth-supernode-private-key" not in default


def test_the_connection_flwr_uses_names_the_superlink_and_how_to_trust_it(tmp_path: Path) -> None:
    secure = tomllib.loads(deploy_commands.connection_toml("10.0.0.1:9093", tmp_path / "ca.crt"))
    assert secure == {
        "superlink": {
            "default": "fedsketch-deploy",
            "fedsketch-deploy": {"address": "10.0.0.1:9093", "root-certificates": str(tmp_path / "ca.crt")},
        }
    }
    plain = tomllib.loads(deploy_commands.connection_toml("127.0.0.1:9093", None))
    assert plain["superlink"]["fedsketch-deploy"] == {"address": "127.0.0.1:9093", "insecure": True}
