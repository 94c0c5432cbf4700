"""The deployment kit: certificates, SuperNode keys and the commands printed for real devices."""

from __future__ import annotations

import ipaddress
import shlex
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from experiments.cli import main as fedsketch_main
from experiments.deployment.deploy import CHECKPOINT_EVERY, Deployment, node_settings
from experiments.deployment.recipe import check_kit_folder, write_kit
from experiments.running import runner


def test_kit_has_a_server_certificate_for_the_server_and_loopback_signed_by_its_ca(tmp_path: Path) -> None:
    write_kit(tmp_path / "kit", "192.168.1.10", 2)
    ca = x509.load_pem_x509_certificate((tmp_path / "kit" / "server" / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "kit" / "server" / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("192.168.1.10", "127.0.0.1")
    }
    assert not (tmp_path / "kit" / "server" / "ca.key").exists()  # the CA key stays off the server


def test_each_device_gets_its_own_p384_key_pair_and_a_command_for_its_partition(tmp_path: Path) -> None:
    text = write_kit(tmp_path / "kit", "edge.example.org", 3, port=9100)
    publics = set()
    for i in range(3):
        device = tmp_path / "kit" / "devices" / f"node-{i}"
        private = load_ssh_private_key((device / f"node-{i}").read_bytes(), None)
        public = load_ssh_public_key((device / f"node-{i}.pub").read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(public, ec.EllipticCurvePublicKey)
        assert private.public_key() == public and public.curve.name == "secp384r1"
        publics.add(public.public_numbers())
        command = shlex.split((device / "supernode.sh").read_text().splitlines()[-1])
        assert command[1:4] == [
            "python",
            "-m",
            "bridge.runtime.launcher",
        ]  # the warm launcher, not one process a round
        assert command[command.index("--port") + 1] == "${FEDSKETCH_RUNTIME_PORT:-9094}"
        assert command[command.index("--superlink") + 1] == "edge.example.org:9100"
        assert command[command.index("--node-config") + 1] == f"partition-id={i} num-partitions=3"
        assert command[command.index("--auth-supernode-private-key") + 1] == f"node-{i}"
        unit = [arg.replace("${FEDSKETCH_RUNTIME_PORT:-9094}", "9094") for arg in command[1:]]
        assert (
            f"ExecStart=/opt/fedsketch/venv/bin/{shlex.join(unit)}"
            in (device / "fedsketch-supernode.service").read_text()
        )
        assert f"flwr supernode register devices/node-{i}/node-{i}.pub fedsketch-deploy" in text
    assert len(publics) == 3
    settings = tomllib.loads((tmp_path / "kit" / "admin" / "run_config.toml").read_text())
    assert settings.items() >= node_settings(3).items()
    # the SuperLink keeps its state in the kit's server/ folder: a restart keeps the registered devices
    link = next(shlex.split(line) for line in text.splitlines() if line.strip().startswith("flower-superlink"))
    assert link[link.index("--database") + 1] == "server/superlink.db"


def test_the_kits_run_config_is_the_experiment_files_run_with_one_client_per_device(tmp_path: Path) -> None:
    """One source of settings: the run ``fedsketch deploy`` runs, in a folder of its own, relative to the SuperLink's."""
    assert (
        fedsketch_main(
            [
                "deploy",
                "--kit",
                str(tmp_path / "kit"),
                "--server",
                "10.0.0.1",
                "--supernodes",
                "3",
                "--set",
                "num-rounds=7",
            ]
        )
        == 0
    )
    admin = tmp_path / "kit" / "admin"
    deployed = runner.load_experiment(runner.DEFAULT_CONFIG, {**node_settings(3), "num-rounds": 7}).runs
    assert [run.strategy for run in deployed] == ["fetchsgd", "local_topk", "fedavg"]
    names = ["run_config.toml", *(f"run_config.{run.strategy}.toml" for run in deployed[1:])]
    saves = {
        "fetchsgd": CHECKPOINT_EVERY,
        "local_topk": 0,
        "fedavg": CHECKPOINT_EVERY,
    }  # local top-k's clients keep state
    for name, run in zip(names, deployed, strict=True):
        settings = tomllib.loads((admin / name).read_text())
        expected = {"experiment": "default-kit", "out-dir": "runs", "checkpoint-every": saves[run.strategy]}
        assert settings == {**run.to_mapping(), **expected}
        assert settings["min-nodes"] == 2  # a quorum of the 3 devices
    settings = tomllib.loads((admin / "run_config.toml").read_text())
    assert (settings["strategy"], settings["num-rounds"], settings["sketch-cols"]) == ("fetchsgd", 7, 9000)
    assert "runs/default-kit/fetchsgd/metrics.jsonl" in (tmp_path / "kit" / "INSTRUCTIONS.txt").read_text()


def test_a_kit_never_overwrites_keys(tmp_path: Path) -> None:
    write_kit(tmp_path, "10.0.0.1", 1)
    with pytest.raises(ValueError, match="already holds a kit"):
        write_kit(tmp_path, "10.0.0.1", 1)


def test_supernode_auth_without_tls_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="needs TLS"):
        Deployment(2, tls=False, auth=True)
    assert fedsketch_main(["deploy", "--auth"]) == 2
    assert "needs TLS" in capsys.readouterr().err


def test_a_kit_goes_only_into_a_new_or_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file, a folder holding anything (a partial kit, a key of one's own) is refused; nothing is written."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="is a file; a kit needs a new or empty folder"):
        write_kit(tmp_path / "afile", "10.0.0.1", 1)
    for held in ("admin/config.toml", "ca.key", "notes.txt"):
        folder = tmp_path / held.replace("/", "_")
        (folder / held).parent.mkdir(parents=True)
        (folder / held).write_text("mine")
        with pytest.raises(ValueError, match="is not empty; choose an empty folder"):
            write_kit(folder, "10.0.0.1", 1)
        assert (folder / held).read_text() == "mine" and len(list(folder.rglob("*"))) == len(Path(held).parts)
    args = ["deploy", "--kit", str(tmp_path / "ca.key"), "--server", "10.0.0.1"]
    assert fedsketch_main(args) == 2
    assert capsys.readouterr().err.strip().endswith("is not empty; choose an empty folder (keys are never overwritten)")


def test_a_kit_inside_the_app_folder_must_be_one_its_gitignore_excludes(tmp_path: Path) -> None:
    """``flwr run`` ships the app folder less what its ``.gitignore`` excludes: a kit there would travel with every run."""
    app = tmp_path / "app"
    app.mkdir()
    (app / ".gitignore").write_text("fedsketch-kit/\nbuild/\n")
    check_kit_folder(app / "fedsketch-kit", app)  # excluded: accepted
    check_kit_folder(app / "build" / "kits" / "one", app)  # below an excluded folder: accepted
    check_kit_folder(tmp_path / "elsewhere", app)  # outside: accepted
    with pytest.raises(ValueError, match=r"is inside the app folder .*, which flwr run ships: choose a folder outside"):
        check_kit_folder(app / "my-kit", app)
    (app / ".gitignore").unlink()
    with pytest.raises(ValueError, match="inside the app folder"):
        check_kit_folder(app / "fedsketch-kit", app)  # no .gitignore: everything ships
