"""References to user code (``package.module:function`` or a pickle): found, imported and refused by name."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsketch.settings import entry


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``entrylab`` in a fresh folder, on no path yet; its modules forgotten afterwards."""
    pkg = tmp_path / "entrylab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(
        "def build():\n    return 'built'\n\nclass Zoo:\n    def tiny():\n        return 'tiny'\n\nSIZE = 3\n"
    )
    (pkg / "broken.py").write_text("import not_a_module_anywhere_xyz\n")
    (pkg / "raising.py").write_text("raise RuntimeError('bad config\\nsecond line')\n")
    (tmp_path / "flat.py").write_text("def make():\n    return 'flat'\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.chdir(tmp_path.parent)
    yield tmp_path
    for name in [m for m in sys.modules if m == "flat" or m.split(".")[0] == "entrylab"]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("value", "reference"),
    [("pkg.mod:fn", True), ("builder.pkl", True), ("mlp", False), ("cifar10", False), ("a.b", False)],
)
def test_a_reference_has_a_colon_or_ends_in_pkl(value: str, reference: bool) -> None:
    assert entry.is_reference(value) is reference


@pytest.mark.parametrize("value", ["pkg.mod:fn", "m:f", "_p.m2:Cls.method", "x.pkl", "any thing.pkl"])
def test_well_formed_references_pass_the_syntax_check(value: str) -> None:
    assert entry.check_syntax("model", value) is None


@pytest.mark.parametrize("value", ["pkg.mod:", ":fn", "pkg..mod:fn", "1pkg:fn", "pkg:fn()", "a:b:c", "pkg.mod:fn "])
def test_a_malformed_reference_is_refused_by_setting_and_value(value: str) -> None:
    reason = f"setting 'dataset': {value!r} is not a reference of the form 'package.module:function'"
    assert entry.check_syntax("dataset", value) == reason
    with pytest.raises(ValueError) as caught:
        entry.load("dataset", value)
    assert str(caught.value) == reason


def test_a_reference_loads_the_function_or_the_dotted_attribute_it_names(lab: Path) -> None:
    sys.path.append(str(lab))
    assert entry.load("model", "entrylab.models:build")() == "built"
    assert entry.load("model", "entrylab.models:Zoo.tiny")() == "tiny"


def test_a_module_in_the_current_folder_is_found_as_python_m_would(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(lab)
    assert entry.load("model", "flat:make")() == "flat"
    assert sys.path[-1] == str(lab)  # tried last, after the Python path


def test_what_cannot_be_loaded_is_refused_in_one_line_naming_the_setting(lab: Path) -> None:
    sys.path.append(str(lab))
    models = lab / "entrylab" / "models.py"
    cases = {
        "entrylab.models:nothing": f"setting 'model': module 'entrylab.models' ({models}) has no 'nothing'",
        "entrylab.models:Zoo.nothing": f"setting 'model': module 'entrylab.models' ({models}) has no 'Zoo.nothing'",
        "entrylab.broken:fn": "setting 'model': importing 'entrylab.broken' failed: No module named 'not_a_module_anywhere_xyz'",
        "entrylab.raising:fn": "setting 'model': importing 'entrylab.raising' failed: RuntimeError: bad config\nsecond line",
    }
    for value, message in cases.items():
        with pytest.raises(ValueError) as caught:
            entry.load("model", value)
        assert str(caught.value) == message
    with pytest.raises(TypeError, match=r"^setting 'model': 'entrylab.models:SIZE' is a int, not a function$"):
        entry.load("model", "entrylab.models:SIZE")


def test_a_module_found_nowhere_names_the_folders_searched(lab: Path) -> None:
    with pytest.raises(ValueError) as caught:
        entry.load("dataset", "nowhere_pkg_xyz.data:load")
    assert str(caught.value) == (
        f"setting 'dataset': no module 'nowhere_pkg_xyz.data' on the Python path or in {os.getcwd()}: "
        "install its package or run from the folder that holds it"
    )


def test_a_pickled_builder_is_loaded_and_anything_else_refused(lab: Path) -> None:
    good, bad = lab / "b.pkl", lab / "n.pkl"
    good.write_bytes(pickle.dumps(len))
    bad.write_bytes(pickle.dumps(42))
    assert entry.load("model", str(good)) is len
    with pytest.raises(TypeError, match=rf"^setting 'model': {bad} holds a int, not a function$"):
        entry.load("model", str(bad))
    with pytest.raises(ValueError, match=rf"^setting 'dataset': no pickled builder at {lab / 'gone.pkl'}$"):
        entry.load("dataset", str(lab / "gone.pkl"))


def test_the_code_root_is_the_folder_above_the_top_package_or_the_module(lab: Path) -> None:
    sys.path.append(str(lab))
    assert entry.code_root("model", "entrylab.models:build") == lab
    assert entry.code_root("model", "flat:make") == lab
    assert entry.code_root("model", str(lab / "b.pkl")) is None


def test_exporting_the_root_puts_it_first_on_pythonpath_once(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(lab)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", ""]))
    for _ in range(2):
        entry.export_code_root("model", "entrylab.models:build")
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(lab), "/elsewhere"])
    assert sys.path.count(str(lab)) == 1
    entry.export_code_root("model", str(lab / "b.pkl"))  # a pickle has no folder to export
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(lab), "/elsewhere"])


def _user_line(lab: Path, body: str) -> BaseException:
    """What ``usercode.fail()`` raised: it calls ``userhelp.inner()`` (another file), whose line 4 is ``body``."""
    (lab / "usercode.py").write_text("from userhelp import inner\n\n\ndef fail():\n    return inner()\n")  # line 5
    (lab / "userhelp.py").write_text("import numpy as np\n\ndef inner():\n" + body)
    sys.path.append(str(lab))
    import usercode  # type: ignore[import-not-found]

    try:
        usercode.fail()
    except Exception as exc:  # noqa: BLE001
        return exc
    finally:
        del sys.modules["usercode"], sys.modules["userhelp"]
    raise AssertionError("fail() returned")


def test_what_user_code_raised_reads_as_one_line_with_its_own_deepest_place(lab: Path) -> None:
    exc = _user_line(lab, "    raise ValueError('no good\\nmore')\n")
    assert entry.raised(exc) == f"ValueError: no good (at {lab / 'userhelp.py'}:4)"
    assert entry.raised(KeyError()) == "KeyError: "


def test_the_place_of_what_an_installed_package_raised_is_the_user_line_that_called_it(lab: Path) -> None:
    exc = _user_line(lab, "    return np.linalg.inv(np.zeros((2, 2)))\n")
    assert entry.raised(exc) == f"LinAlgError: Singular matrix (at {lab / 'userhelp.py'}:4)"


def test_a_reference_found_on_the_path_leaves_the_current_folder_off_it(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.append(str(lab))
    elsewhere = lab / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    entry.load("model", "entrylab.models:build")
    assert str(elsewhere) not in sys.path


def test_exporting_a_root_that_left_the_path_puts_it_back(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH")
    sys.path.append(str(lab))
    entry.load("model", "entrylab.models:build")  # imported now: found again without the path
    sys.path.remove(str(lab))
    entry.export_code_root("model", "entrylab.models:build")
    assert os.environ["PYTHONPATH"] == str(lab)
    assert sys.path[-1] == str(lab)


def test_a_root_that_cannot_be_found_names_the_setting(lab: Path) -> None:
    for find in (entry.code_root, entry.export_code_root):
        with pytest.raises(ValueError, match=r"^setting 'dataset': no module 'nowhere_pkg_xyz' on the Python path"):
            find("dataset", "nowhere_pkg_xyz.data:load")
