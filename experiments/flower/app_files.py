"""The app's files as Flower puts them in a FAB, staged in a folder of their own (both runtimes that submit a FAB use it).

``flwr run DIR`` (a simulation through a SuperLink, :mod:`experiments.flower.superlink_run`) and
``fedsketch deploy`` (:mod:`experiments.deployment.deploy`) submit the app as a FAB built from a
folder; staging that folder first skips the virtual environment and names another ClientApp
component where a runtime needs one.
"""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bridge import flower
from fedsketch.settings.setting import ConfigError

INPROCESS_CLIENTAPP = "clients.inprocess_app:app"
"""The ClientApp component an in-process simulation is run with: importing it installs the backend."""


def clientapp_for(backend: str) -> str | None:
    """The ClientApp component a simulation with ``backend`` runs instead of the app's own (``None``: the app's)."""
    return INPROCESS_CLIENTAPP if backend == "inprocess" else None


def check_app_config(app_dir: Path, keys: Iterable[str]) -> None:
    """The app's ``[tool.flwr.app.config]`` lists exactly the run settings ``keys``.

    Flower takes a run's settings as overrides of that table and refuses a key it
    does not list, inside its own process, once the run has started; checked here,
    a method's new setting left out of ``pyproject.toml`` is one line before anything starts.

    Raises
    ------
    ConfigError
        Naming the keys the table lacks, or lists without a setting behind them.
    """
    pyproject = app_dir / "pyproject.toml"
    with open(pyproject, "rb") as f:
        listed = set(tomllib.load(f).get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))
    missing, extra = sorted(set(keys) - listed), sorted(listed - set(keys))
    if missing:
        raise ConfigError(
            f"{pyproject}: [tool.flwr.app.config] lacks {', '.join(missing)}; "
            "every setting needs a line there with its default (docs/extending.md)"
        )
    if extra:
        raise ConfigError(f"{pyproject}: [tool.flwr.app.config] lists {', '.join(extra)}, which no setting declares")


COMPONENT = re.compile(r'^clientapp = "[^"]*"$', re.MULTILINE)
"""The ClientApp's line in the app's ``[tool.flwr.app.components]``."""


def stage_app(app_dir: Path, dest: Path, clientapp: str | None = None) -> Path:
    """The files of ``app_dir`` that Flower puts in the app's FAB, copied to ``dest`` (emptied first);
    ``clientapp``: the ClientApp component the copy names instead of the app's own.

    ``flwr run DIR`` reads every file below DIR before it drops those that
    ``.gitignore`` and its own rules exclude (``collect_files`` in
    ``flwr/cli/utils.py``): with the virtual environment inside the project
    folder, as the README's set-up makes it, seconds before every run
    (docs/deployment.md). This walk skips the folders ``.gitignore``
    excludes, then applies Flower's own filter, so the FAB holds the same files.
    Where Flower's filter cannot be imported, ``app_dir`` itself is returned.

    Raises
    ------
    ValueError
        If ``dest`` is ``app_dir`` or holds it (emptying it would delete the app).
    """
    if app_dir.resolve().is_relative_to(dest.resolve()):
        raise ValueError(f"cannot stage the app {app_dir} into {dest}: it would be deleted first")
    ignored, filter_paths_for_publish = flower.gitignore_spec(app_dir), flower.fab_filter()
    if ignored is None or filter_paths_for_publish is None:  # no Flower internals: `flwr run` walks the folder
        return app_dir
    files: dict[str, Path] = {}
    own = dest.resolve()  # an earlier copy in a run folder inside the app, where .gitignore does not exclude it
    for folder, dirs, names in os.walk(app_dir, followlinks=False):
        rel = Path(folder).relative_to(app_dir)
        dirs[:] = [d for d in dirs if not _excludes(ignored, rel / d) and Path(folder, d).resolve() != own]
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink():
                files[(rel / name).as_posix()] = path
    shutil.rmtree(dest, ignore_errors=True)
    for rel_path in filter_paths_for_publish(files):  # the paths it was given that it keeps
        target = dest / rel_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files[rel_path], target)
    if clientapp is not None:
        pyproject = dest / "pyproject.toml"
        text, found = COMPONENT.subn(f'clientapp = "{clientapp}"', pyproject.read_text(encoding="utf-8"))
        if found != 1:
            raise ValueError(f"{app_dir / 'pyproject.toml'} names no one clientapp component to replace")
        pyproject.write_text(text, encoding="utf-8")
    return dest


def ships(app_dir: Path, folder: Path) -> bool:
    """Whether ``flwr run app_dir`` would put ``folder`` in the FAB: it lies in ``app_dir`` and the
    app's ``.gitignore`` does not exclude it, read as Flower reads it (``True`` where Flower's filter
    cannot be imported: nothing shows it would be left out)."""
    app, target = app_dir.resolve(), folder.resolve()
    if not target.is_relative_to(app):
        return False
    ignored = flower.gitignore_spec(app)
    if ignored is None:
        return True
    parts = target.relative_to(app).parts
    return not any(_excludes(ignored, Path(*parts[: i + 1])) for i in range(len(parts)))


def _excludes(ignored: Any, rel_folder: Path) -> bool:
    """Whether the pathspec ``ignored`` leaves out the folder at ``rel_folder`` (relative to the app)."""
    return bool(ignored.match_file(f"{rel_folder.as_posix()}/"))


STAGED = ".staged-app"
"""The folder, in a run's own folder, that holds the app's files while ``flwr run`` submits them."""


@contextmanager
def staged_app(app_dir: Path, under: Path, clientapp: str | None = None) -> Iterator[Path]:
    """:func:`stage_app` into ``under/.staged-app``, deleted on the way out (the FAB is built at submission).

    ``under`` is the run's own folder: a command killed with SIGKILL leaves the copy there, never in
    the system's temporary folder, and the run's next start replaces it.
    """
    dest = under / STAGED
    try:
        yield stage_app(app_dir, dest, clientapp)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
