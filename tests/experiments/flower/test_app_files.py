"""experiments/flower/app_files.py: the app's config checked against the settings; `flwr run` gets a copy of exactly
the files Flower would put in the FAB, and only the folders it would pack ship."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.cli.utils import collect_files, filter_paths_for_publish

from bridge import flower
from experiments.flower.app_files import (
    INPROCESS_CLIENTAPP,
    STAGED,
    check_app_config,
    clientapp_for,
    ships,
    stage_app,
    staged_app,
)
from experiments.running.command_plan import APP_DIR
from fedsketch.config import RunConfig
from fedsketch.settings.setting import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _fab_files(app_dir: Path) -> dict[str, bytes]:
    """What `flwr run APP_DIR` itself would pack: every file below it, then Flower's filter."""
    picked = filter_paths_for_publish(collect_files(app_dir))
    return {rel: src if isinstance(src, bytes) else src.read_bytes() for rel, src in picked.items()}


@pytest.mark.slow  # walks the whole project as Flower's packer does: about 10 s
def test_the_staged_app_holds_the_files_flower_would_pack_and_nothing_else(tmp_path: Path) -> None:
    staged = stage_app(ROOT, tmp_path / "app")
    assert staged == tmp_path / "app"
    copied = {p.relative_to(staged).as_posix(): p.read_bytes() for p in staged.rglob("*") if p.is_file()}
    expected = _fab_files(ROOT)
    assert "pyproject.toml" in copied and "clients/client_app.py" in copied
    assert copied.keys() == expected.keys()
    assert copied == expected


def test_ignored_folders_are_skipped_and_a_new_staging_replaces_the_old(tmp_path: Path) -> None:
    app = tmp_path / "src"
    (app / "pkg").mkdir(parents=True)
    (app / "pkg" / "mod.py").write_text("X = 1\n")
    (app / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (app / ".gitignore").write_text("big/\n*.log\n")
    (app / "big" / "deep").mkdir(parents=True)
    (app / "big" / "deep" / "skip.py").write_text("raise SystemExit\n")
    (app / "pkg" / "run.log").write_text("noise\n")
    staged = stage_app(app, tmp_path / "app")
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()) == sorted(_fab_files(app))
    assert not (staged / "big").exists() and (staged / "pkg" / "mod.py").read_text() == "X = 1\n"
    (app / "pkg" / "mod.py").unlink()
    assert not (stage_app(app, staged) / "pkg" / "mod.py").exists()


def test_staging_into_the_app_itself_is_refused_before_anything_is_deleted(tmp_path: Path) -> None:
    app = tmp_path / "app"
    (app / "pkg").mkdir(parents=True)
    (app / "pyproject.toml").write_text('[project]\nname = "x"\n')
    for dest in (app, tmp_path):
        with pytest.raises(ValueError, match="it would be deleted first"):
            stage_app(app, dest)
    assert (app / "pyproject.toml").exists()


def test_an_inprocess_run_is_staged_with_the_inprocess_clientapp_only(tmp_path: Path) -> None:
    """The in-process backend's one switch: the staged copy names it as the ClientApp; the project keeps its own."""
    staged = stage_app(ROOT, tmp_path / "app", INPROCESS_CLIENTAPP)
    text = (staged / "pyproject.toml").read_text()
    assert f'clientapp = "{INPROCESS_CLIENTAPP}"' in text and "clients.client_app:app" not in text
    assert 'clientapp = "clients.client_app:app"' in (ROOT / "pyproject.toml").read_text()
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ValueError, match="names no one clientapp component"):
        stage_app(bare, tmp_path / "bare-staged", INPROCESS_CLIENTAPP)


@pytest.mark.slow  # a real process, killed
def test_a_killed_command_leaves_its_staged_app_in_the_runs_folder_and_the_next_start_replaces_it(
    tmp_path: Path,
) -> None:
    """SIGKILL cannot be caught: the copy stays where the run's other files are, never in the temporary folder."""
    app, run = tmp_path / "src", tmp_path / "runs" / "x"
    (app / "pkg").mkdir(parents=True)
    (app / "pkg" / "mod.py").write_text("X = 1\n")
    (app / "pyproject.toml").write_text('[project]\nname = "x"\n')
    run.mkdir(parents=True)
    (tmp_path / "tmp").mkdir()  # the command's temporary folder
    code = (
        "import sys, time; from pathlib import Path; from experiments.flower.app_files import staged_app\n"
        "with staged_app(Path(sys.argv[1]), Path(sys.argv[2])) as s:\n    print(s, flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen([sys.executable, "-c", code, str(app), str(run)], stdout=subprocess.PIPE, cwd=ROOT, env=env)
    assert proc.stdout is not None
    staged = Path(proc.stdout.readline().decode().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert staged == run / STAGED and (staged / "pkg" / "mod.py").exists()
    assert not any((tmp_path / "tmp").iterdir())
    (app / "pkg" / "mod.py").write_text("X = 2\n")
    with staged_app(app, run) as again:
        assert again == staged and (again / "pkg" / "mod.py").read_text() == "X = 2\n"
    assert not staged.exists()


def test_a_run_folder_inside_the_app_is_not_staged_into_itself(tmp_path: Path) -> None:
    """An out folder that .gitignore does not exclude: the earlier copy there is no file of the app."""
    app = tmp_path / "src"
    (app / "pkg").mkdir(parents=True)
    (app / "pkg" / "mod.py").write_text("X = 1\n")
    (app / "pyproject.toml").write_text('[project]\nname = "x"\n')
    run = app / "results" / "x"
    stage_app(app, run / STAGED)
    staged = stage_app(app, run / STAGED)
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()) == [
        "pkg/mod.py",
        "pyproject.toml",
    ]


def test_a_setting_missing_from_the_apps_config_is_named_before_anything_starts(tmp_path: Path) -> None:
    """Flower would refuse it inside its own process; the check names it, and a key no setting declares."""
    keys = RunConfig().to_mapping()
    check_app_config(APP_DIR, keys)  # the app's own table is complete
    text = (APP_DIR / "pyproject.toml").read_text(encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(text.replace("\nqsgd-levels = ", "\nunknown-levels = "), encoding="utf-8")
    with pytest.raises(ConfigError) as lacks:
        check_app_config(tmp_path, keys)
    assert str(lacks.value) == (
        f"{tmp_path / 'pyproject.toml'}: [tool.flwr.app.config] lacks qsgd-levels; every setting needs a line there "
        "with its default (docs/extending.md)"
    )
    with pytest.raises(ConfigError) as lists:
        check_app_config(tmp_path, [key for key in keys if key != "qsgd-levels"])
    assert str(lists.value) == (
        f"{tmp_path / 'pyproject.toml'}: [tool.flwr.app.config] lists unknown-levels, which no setting declares"
    )
    (tmp_path / "pyproject.toml").write_text("[tool.flwr.app.config]\nb = 1\nc = 2\n", encoding="utf-8")
    check_app_config(tmp_path, ["c", "b"])
    with pytest.raises(ConfigError, match=r"lacks a, d; every"):
        check_app_config(tmp_path, ["d", "c", "b", "a"])
    with pytest.raises(ConfigError, match=r"lists b, c, which"):
        check_app_config(tmp_path, [])
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n", encoding="utf-8")
    check_app_config(tmp_path, [])  # no table: no setting listed
    with pytest.raises(ConfigError, match=r"lacks a; every"):
        check_app_config(tmp_path, ["a"])


def test_a_symlinked_folder_is_not_followed_and_the_refusal_names_the_apps_file(tmp_path: Path) -> None:
    app, outside = tmp_path / "src", tmp_path / "outside"
    (app / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "far.py").write_text("X = 1\n")
    (app / "pkg" / "mod.py").write_text("X = 1\n")
    (app / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (app / "linked").symlink_to(outside, target_is_directory=True)
    staged = stage_app(app, tmp_path / "app")
    files = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert files == ["pkg/mod.py", "pyproject.toml"]
    with pytest.raises(ValueError) as none:
        stage_app(app, tmp_path / "again", INPROCESS_CLIENTAPP)
    assert str(none.value) == f"{app / 'pyproject.toml'} names no one clientapp component to replace"


def test_only_the_inprocess_backend_runs_another_clientapp() -> None:
    assert clientapp_for("inprocess") == INPROCESS_CLIENTAPP and clientapp_for("ray") is None


def test_a_folder_ships_when_it_lies_in_the_app_and_no_folder_on_its_way_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = tmp_path / "src"
    (app / "runs" / "a" / "b").mkdir(parents=True)
    (app / "kept" / "logs").mkdir(parents=True)
    (app / ".gitignore").write_text("runs/\nlogs/\n")
    assert ships(app, app / "kept") and ships(app, app / "kept" / ".." / "kept")
    assert not ships(app, app / "runs") and not ships(app, app / "runs" / "a" / "b")  # below an ignored folder
    assert not ships(app, app / "kept" / "logs") and not ships(app, tmp_path / "elsewhere")
    (app / ".gitignore").write_text("runs/\n!runs/a/\n")  # git never looks inside a folder it ignores
    assert not ships(app, app / "runs" / "a")
    monkeypatch.setenv(flower.SWITCH, "1")  # without Flower's filter nothing shows it would be left out
    assert ships(app, app / "runs") and not ships(app, tmp_path / "elsewhere")
