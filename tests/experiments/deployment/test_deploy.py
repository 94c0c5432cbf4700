"""The deployment kit: certificates, SuperNode keys and the commands printed for real devices."""

from __future__ import annotations

import configparser
import ipaddress
import shlex
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from experiments.cli import main as fedsketch_main
from experiments.deployment.deploy_commands import CHECKPOINT_EVERY, Deployment, node_settings
from experiments.deployment.recipe import check_kit_folder, kit_runs, write_kit
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


def test_a_devices_script_runs_its_command_from_its_folder_with_the_venvs_python(tmp_path: Path) -> None:
    """supernode.sh run for real, with a ``python`` that prints where it runs, its environment and its arguments."""
    write_kit(tmp_path / "kit", "10.0.0.1", 2, port=9100)
    device = tmp_path / "kit" / "devices" / "node-1"
    stub = tmp_path / "venv" / "bin" / "python"
    stub.parent.mkdir(parents=True)
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$PWD" "$FLWR_HOME" "$FLWR_TELEMETRY_ENABLED" "$@"\n')
    stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "FEDSKETCH_VENV": str(tmp_path / "venv")}
    done = subprocess.run([str(device / "supernode.sh")], env=env, capture_output=True, text=True, check=True)
    cwd, home, telemetry, *args = done.stdout.splitlines()
    assert (cwd, home, telemetry) == (str(device), str(tmp_path / "home" / ".flwr"), "0")
    assert args[:4] == ["-m", "bridge.runtime.launcher", "--port", "9094"]
    assert args[args.index("--root-certificates") + 1] == "ca.crt" and (device / "ca.crt").is_file()
    assert args[args.index("--auth-supernode-private-key") + 1] == "node-1" and (device / "node-1").is_file()
    assert args[args.index("--node-config") + 1] == "partition-id=1 num-partitions=2"
    env |= {"FEDSKETCH_RUNTIME_PORT": "9200", "FLWR_HOME": str(tmp_path / "mine")}
    done = subprocess.run([str(device / "supernode.sh")], env=env, capture_output=True, text=True, check=True)
    _, home, _, *args = done.stdout.splitlines()
    assert home == str(tmp_path / "mine") and args[3] == "9200"
    assert (device / "ca.crt").read_bytes() == (tmp_path / "kit" / "server" / "ca.crt").read_bytes()


def _line(text: str, start: str) -> list[str]:
    return shlex.split(next(line for line in text.splitlines() if line.strip().startswith(start)))


def test_the_instructions_name_the_kits_own_files_in_every_command(tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    text = write_kit(kit, "10.0.0.1", 3, port=9100)
    link = _line(text, "flower-superlink")
    value = {flag: link[link.index(flag) + 1] for flag in ("--host", "--port", "--database")}
    assert value == {"--host": "0.0.0.0", "--port": "9100", "--database": "server/superlink.db"}
    assert "--enable-supernode-auth" in link and "--insecure" not in link
    for flag, name in (
        ("--ssl-ca-certfile", "ca.crt"),
        ("--ssl-certfile", "server.pem"),
        ("--ssl-keyfile", "server.key"),
    ):
        assert link[link.index(flag) + 1] == f"server/{name}" and (kit / "server" / name).is_file()
    registered = [line.split() for line in text.splitlines() if line.strip().startswith("flwr supernode register")]
    assert [words[3] for words in registered] == [f"devices/node-{i}/node-{i}.pub" for i in range(3)]
    assert all((kit / words[3]).is_file() and words[4] == "fedsketch-deploy" for words in registered)
    device_0 = shlex.split(text.split("Device 0 runs: ", 1)[1].splitlines()[0])
    script = shlex.split((kit / "devices" / "node-0" / "supernode.sh").read_text().splitlines()[-1])[1:]
    assert device_0 == [arg.replace("${FEDSKETCH_RUNTIME_PORT:-9094}", "9094") for arg in script]
    assert device_0[device_0.index("--node-config") + 1] == "partition-id=0 num-partitions=3"
    assert device_0[device_0.index("--superlink") + 1] == "10.0.0.1:9100"


def test_the_instructions_list_each_run_config_on_a_line_of_its_own(tmp_path: Path) -> None:
    runs = kit_runs(2, strategies=["fedavg", "fetchsgd"])
    text = write_kit(tmp_path / "kit", "10.0.0.1", 2, runs=runs)
    listed = [
        line.split(":", 1)[0].strip() for line in text.splitlines() if line.strip().startswith("admin/run_config")
    ]
    assert listed == ["admin/run_config.toml", "admin/run_config.fetchsgd.toml"]


def test_a_devices_service_starts_after_the_network_and_restarts_it(tmp_path: Path) -> None:
    write_kit(tmp_path / "kit", "10.0.0.1", 2)
    device = tmp_path / "kit" / "devices" / "node-1"
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    unit.read_string((device / "fedsketch-supernode.service").read_text())
    assert dict(unit["Unit"]) == {
        "Description": "fedsketch Flower SuperNode 1 of 2",
        "After": "network-online.target",
        "Wants": "network-online.target",
    }
    service = unit["Service"]
    assert (service["User"], service["WorkingDirectory"]) == ("fedsketch", "/opt/fedsketch/node-1")
    assert (service["Restart"], service["RestartSec"]) == ("always", "10")
    assert dict(unit["Install"]) == {"WantedBy": "multi-user.target"}
    assert stat.S_IMODE((device / "supernode.sh").stat().st_mode) == 0o755


def test_a_kits_runs_keep_a_name_or_checkpoints_given_and_their_results_folder_relative(tmp_path: Path) -> None:
    config = tmp_path / "mine.toml"
    config.write_text(
        '[run]\nexperiment = "mine"\nnum-rounds = 3\n\n[compare]\nstrategies = ["fedavg", "local_topk"]\n'
    )
    runs = kit_runs(4, config, seeds=2, out_dir="results")
    assert [(cfg.experiment, cfg.strategy, cfg.seed, cfg.out_dir) for cfg in runs] == [
        ("mine-kit", "fedavg", 0, "results"),
        ("mine-kit", "fedavg", 1, "results"),
        ("mine-kit", "local_topk", 0, "results"),
        ("mine-kit", "local_topk", 1, "results"),
    ]
    assert [cfg.checkpoint_every for cfg in runs] == [CHECKPOINT_EVERY, CHECKPOINT_EVERY, 0, 0]
    assert all((cfg.num_clients, cfg.min_nodes, cfg.num_rounds) == (4, 3, 3) for cfg in runs)
    given = kit_runs(2, config, {"experiment": "field", "checkpoint-every": 0, "num-clients": 2}, ["fedavg"])
    assert [(cfg.experiment, cfg.checkpoint_every, cfg.out_dir) for cfg in given] == [("field", 0, "runs")]


def test_a_kit_needs_a_device_and_its_connection_trusts_its_own_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"^a deployment needs at least one device; got 0$"):
        write_kit(tmp_path / "none", "10.0.0.1", 0)
    assert not (tmp_path / "none").exists()
    monkeypatch.chdir(tmp_path)
    text = write_kit(Path("kit"), "10.0.0.1", 1, port=9100)  # a relative folder: named in full
    kit = tmp_path / "kit"
    assert text.startswith(f"fedsketch deployment kit in {kit}: ") and (kit / "INSTRUCTIONS.txt").read_text() == text
    connection = tomllib.loads((kit / "admin" / "config.toml").read_text())["superlink"]["fedsketch-deploy"]
    assert connection == {"address": "10.0.0.1:9100", "root-certificates": str(kit / "server" / "ca.crt")}
    assert sorted(p.name for p in kit.iterdir()) == ["INSTRUCTIONS.txt", "admin", "ca.key", "devices", "server"]


def test_the_instructions_paths_are_the_kits_files(tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    text = write_kit(kit, "10.0.0.1", 3)
    lines = text.split("\n")
    assert f"Keep {kit / 'ca.key'} offline: it signs server certificates and is needed on no machine." in lines
    assert (kit / "ca.key").is_file()
    (home,) = [line.split("=", 1)[1] for line in lines if line.startswith("   export FLWR_HOME=")]
    assert Path(home) == kit / "admin" and (Path(home) / "config.toml").is_file()
    run = _line(text, "flwr run ")
    assert Path(run[run.index("--run-config") + 1]) == kit / "admin" / "run_config.toml"
    registered = [line for line in lines if "flwr supernode register" in line]
    assert registered == [
        f"   flwr supernode register devices/node-{i}/node-{i}.pub fedsketch-deploy" for i in range(3)
    ]
    assert "3. Device i (i = 0..2): copy devices/node-i/ to /opt/fedsketch/node-i" in text


def test_the_kits_server_certificate_names_the_server_and_loopback_by_name_too(tmp_path: Path) -> None:
    write_kit(tmp_path / "kit", "edge.example.org", 1)
    server = x509.load_pem_x509_certificate((tmp_path / "kit" / "server" / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["edge.example.org", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
