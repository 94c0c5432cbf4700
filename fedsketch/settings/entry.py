"""Your own code by name: ``package.module:function`` references to a model builder or a data loader.

The ``model`` and ``dataset`` settings take, beside the built-in names, a
reference in the entry-point syntax of Python packaging (``module:attribute``,
the attribute possibly dotted), or the path of a pickled builder (a file ending
in ``.pkl``, what :func:`experiments.api.run` writes for a function it cannot
name). The module is imported from ``sys.path``, with the current folder tried
last, as ``python -m`` would; :func:`code_root` gives the folder it was found
in, which the command exports on ``PYTHONPATH`` so that every Flower process it
starts (the simulation, Ray workers, SuperNodes) imports the same code.
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
PICKLE_SUFFIX = ".pkl"


def is_reference(value: str) -> bool:
    """Whether a ``model`` or ``dataset`` value names user code rather than a built-in."""
    return ":" in value or value.endswith(PICKLE_SUFFIX)


def check_syntax(key: str, value: str) -> str | None:
    """The reason a reference is malformed, or ``None``; it imports nothing."""
    if value.endswith(PICKLE_SUFFIX):
        return None
    if not _REFERENCE.match(value):
        return f"setting '{key}': {value!r} is not a reference of the form 'package.module:function'"
    return None


def load(key: str, value: str) -> Callable[..., Any]:
    """The callable a reference names.

    Raises
    ------
    ValueError
        One line naming the setting and what failed: the syntax, the import
        (with the folders searched) or the attribute.
    TypeError
        If what it names is not callable.
    """
    if value.endswith(PICKLE_SUFFIX):
        return _unpickle(key, Path(value))
    reason = check_syntax(key, value)
    if reason:
        raise ValueError(reason)
    module_name, _, attribute = value.partition(":")
    module = _import(key, module_name)
    target: object = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"setting '{key}': module {module_name!r} ({module.__file__}) has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"setting '{key}': {value!r} is a {type(target).__name__}, not a function")
    return target


def code_root(key: str, value: str) -> Path | None:
    """The ``sys.path`` folder a reference's top-level package is imported from (``None`` for a pickle);
    ``key`` is the setting that names it, for errors."""
    if value.endswith(PICKLE_SUFFIX):
        return None
    top = value.partition(":")[0].split(".")[0]
    origin = Path(_import(key, top).__file__ or "")
    return origin.parent.parent if origin.name == "__init__.py" else origin.parent


def export_code_root(key: str, value: str) -> None:
    """Put a reference's folder on ``PYTHONPATH`` (and ``sys.path``) for this process and its children."""
    root = code_root(key, value)
    if root is None:
        return
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(root) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *paths])
    if str(root) not in sys.path:
        sys.path.append(str(root))


def _import(key: str, module_name: str) -> Any:
    cwd = os.getcwd()
    for attempt in range(2):
        if attempt and cwd not in sys.path:
            sys.path.append(cwd)  # as `python -m` would find it
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):  # the module itself imports something missing
                raise ValueError(f"setting '{key}': importing {module_name!r} failed: {exc}") from None
        except Exception as exc:  # noqa: BLE001  # whatever the user's module raised while importing, as one line
            raise ValueError(
                f"setting '{key}': importing {module_name!r} failed: {type(exc).__name__}: {exc}"
            ) from None
    raise ValueError(
        f"setting '{key}': no module {module_name!r} on the Python path or in {cwd}: install its package "
        "or run from the folder that holds it"
    )


def _unpickle(key: str, path: Path) -> Callable[..., Any]:
    if not path.is_file():
        raise ValueError(f"setting '{key}': no pickled builder at {path}")
    with path.open("rb") as f:
        target: object = pickle.load(f)  # written by experiments.api with cloudpickle; plain pickle reads it
    if not callable(target):
        raise TypeError(f"setting '{key}': {path} holds a {type(target).__name__}, not a function")
    return target


def raised(exc: BaseException) -> str:
    """What a user's function raised, in one line: ``Type: first line of the message (at file:line)``.

    The place is the deepest frame outside installed packages and fedsketch itself: the user's
    own line that called into torch or numpy, or raised.
    """
    first = str(exc).splitlines()[0] if str(exc) else ""
    ours = Path(__file__).resolve().parent
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "site-packages" not in f.filename and not Path(f.filename).resolve().is_relative_to(ours)
    ]
    place = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {first}{place}"
