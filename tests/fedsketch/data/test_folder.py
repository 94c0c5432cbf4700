"""What real image folders hold besides images: a file that is not one is refused by name, a stray file skipped.

``fedsketch run`` and ``plan`` (their ``main``, in this process) on a folder of
small PNGs with one odd file each.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from PIL import Image

from experiments.cli import main
from fedsketch.data.checks import DataError


def _loader() -> ModuleType:
    """:mod:`fedsketch.data.folder`, imported by the tests that use it: it imports torchvision, whose import
    (about 2.5 s) every test worker would otherwise pay while collecting."""
    from fedsketch.data import folder

    return folder


def _folder(root: Path) -> Path:
    """Two classes of six 6 x 5 grayscale images for training, two each for testing."""
    for split, count in (("train", 6), ("test", 2)):
        for c, name in enumerate(("a", "b")):
            for i in range(count):
                path = root / split / name / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.new("L", (6, 5), 30 + 100 * c + 7 * i).save(path)
    return root


def _args(command: str, root: Path) -> list[str]:
    settings = {
        "dataset": "imagefolder",
        "data-root": str(root),
        "partition": "iid",
        "num-clients": 2,
        "clients-per-round": 2,
        "num-rounds": 1,
        "model-hidden": 16,
        "k": 10,
        "sketch-cols": 100,
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    extra = ["--no-plot"] if command == "run" else []
    return [command, *sets, "--strategies", "fetchsgd", "--out", str(root / "runs"), *extra]


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _text(path: Path) -> None:
    path.write_text("not an image\n", encoding="utf-8")


@pytest.mark.parametrize("spoil", [_truncated, _text], ids=["truncated png", "text named .png"])
def test_a_file_that_is_not_an_image_is_refused_by_name_before_flower_starts(
    tmp_path: Path, spoil: object, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _folder(tmp_path)
    bad = root / "train" / "b" / "3.png"
    spoil(bad)  # type: ignore[operator]
    code = main(_args("run", root))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and err.startswith("fedsketch: error: "), err
    assert f"imagefolder: {bad} cannot be read as an image" in err and "remove or replace it" in err, err
    assert not (root / "runs" / "default").exists()  # no run folder: nothing was started


def test_a_file_without_an_image_extension_is_skipped_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _folder(tmp_path)
    (root / "train" / "a" / "notes.txt").write_text("where these came from\n", encoding="utf-8")
    (root / "test" / ".DS_Store").write_bytes(b"\0\1")
    assert main(_args("plan", root)) == 0
    out = capsys.readouterr().out
    assert "skipped 2 file(s) without an image extension (.jpg, " in out, out
    assert ": test/.DS_Store, train/a/notes.txt\n" in out, out
    assert "12 training samples of shape (1, 5, 6)" in out  # the images, and nothing else, were read


def test_a_clean_folder_skips_nothing_and_says_nothing(tmp_path: Path) -> None:
    *_, classes, note = _loader().load(str(_folder(tmp_path)))
    assert classes == 2 and note == ""


@pytest.mark.parametrize("strays", [3, 5])
def test_the_note_names_three_skipped_files_and_counts_the_rest(tmp_path: Path, strays: int) -> None:
    root = _folder(tmp_path)
    for i in range(strays):
        (root / "train" / "a" / f"n{i}.txt").write_text("x", encoding="utf-8")
    *_, note = _loader().load(str(root))
    more = f" and {strays - 3} more" if strays > 3 else ""
    assert note.startswith(f"skipped {strays} file(s) without an image extension (.jpg, ")
    assert note.endswith(f"): train/a/n0.txt, train/a/n1.txt, train/a/n2.txt{more}")


def test_test_images_of_another_size_or_mode_are_refused_with_both_shapes(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    for path in (root / "test").rglob("*.png"):
        Image.new("RGB", (7, 4), (1, 2, 3)).save(path)
    first = min((root / "test" / "a").glob("*.png"))
    with pytest.raises(DataError) as caught:
        _loader().load(str(root))
    assert str(caught.value) == (
        f"imagefolder:{root}: test images are 4x7 with 3 channel(s) ({first}) but training images are 5x6 with "
        "1 channel(s) in L"
    )


@pytest.mark.parametrize(("mode", "suffix"), [("1", "png"), ("I;16", "png"), ("I", "tiff"), ("L", "bmp")])
def test_every_grayscale_mode_stays_one_channel(tmp_path: Path, mode: str, suffix: str) -> None:
    for split in ("train", "test"):
        for c in ("a", "b"):
            path = tmp_path / split / c / f"0.{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new(mode, (6, 5), 1).save(path)
    x_train, _, x_test, *_ = _loader().load(str(tmp_path))
    assert x_train.shape == (2, 1, 5, 6) and x_test.shape == (2, 1, 5, 6)


def test_colour_images_of_any_mode_become_rgb(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    for i, path in enumerate(sorted(root.rglob("*.png"))):
        Image.new("RGB", (6, 5), (10 * i, 0, 0)).convert(("RGB", "P", "RGBA")[i % 3]).save(path)
    x_train, _, x_test, *_ = _loader().load(str(root))
    assert x_train.shape == (12, 3, 5, 6) and x_test.shape == (4, 3, 5, 6)


def test_a_test_split_without_some_classes_keeps_the_training_labels(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    for path in (root / "test" / "a").glob("*.png"):
        path.unlink()
    (root / "test" / "a").rmdir()
    _, y_train, _, y_test, classes, _ = _loader().load(str(root))
    assert classes == 2 and sorted(set(y_train.tolist())) == [0, 1]
    assert y_test.tolist() == [1, 1] and y_test.dtype == "int64"  # b is class 1, as in train/


def test_a_class_folder_without_images_is_refused_naming_the_folder_and_the_extensions(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    for path in (root / "test" / "b").glob("*.png"):
        path.with_suffix(".txt").write_text("x", encoding="utf-8")
        path.unlink()
    with pytest.raises(FileNotFoundError) as caught:
        _loader().load(str(root))
    assert str(caught.value) == (
        f"imagefolder: {root / 'test'}: Found no valid file for the classes b. Supported extensions are: "
        f"{', '.join(_loader().IMG_EXTENSIONS)}"
    )


def test_an_image_of_another_size_is_refused_with_both_sizes(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    odd = root / "train" / "b" / "4.png"
    Image.new("L", (7, 4), 3).save(odd)
    with pytest.raises(DataError) as caught:
        _loader().load(str(root))
    assert str(caught.value) == f"imagefolder: {odd} is 7x4; {root / 'train' / 'a' / '0.png'} is 6x5"


def test_a_missing_split_says_what_the_data_root_must_hold(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    for root in (str(tmp_path), ""):
        with pytest.raises(FileNotFoundError) as caught:
            _loader().load(root)
        where = Path(root) / ("test" if root else "train")
        assert str(caught.value) == (
            f"imagefolder: no folder {where}; set the data root to a folder holding "
            "train/<class>/<image> and test/<class>/<image>"
        )


def _classes(root: Path, n: int) -> Path:
    for split in ("train", "test"):
        for c in range(n):
            path = root / split / f"c{c}" / "0.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("L", (4, 3), 10 * c).save(path)
    return root


@pytest.mark.parametrize(("n", "shown"), [(2, "c0, c1"), (5, "c0, c1, c2, c3, c4"), (6, "c0, c1, c2, c3, c4, ...")])
def test_a_class_count_the_folders_do_not_hold_is_refused_naming_five_of_them(
    tmp_path: Path, n: int, shown: str
) -> None:
    root = _classes(tmp_path, n)
    assert _loader().load(str(root), num_classes=n)[4] == n
    with pytest.raises(DataError) as caught:
        _loader().load(str(root), num_classes=n + 1)
    assert str(caught.value) == (
        f"imagefolder:{root}: setting 'num-classes' is {n + 1} but train/ holds {n} class folders ({shown})"
    )


def test_colour_images_are_standardized_channel_by_channel_on_the_training_split(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    for i, path in enumerate(sorted(root.rglob("*.png"))):
        Image.new("RGB", (6, 5), (10 * i, 200 - 3 * i, 90)).save(path)
    first = root / "train" / "a" / "0.png"
    for path in (root / "test").rglob("*.png"):
        path.write_bytes(first.read_bytes())
    x_train, _, x_test, *_ = _loader().load(str(root))
    assert torch.equal(x_test, x_train[:1].expand_as(x_test))  # by the training split's mean and deviation
    assert x_train.mean(dim=(0, 2, 3)).abs().max() < 1e-5
    assert torch.allclose(x_train[:, :2].std(dim=(0, 2, 3)), torch.ones(2), atol=1e-5)
    assert x_train[:, 2].abs().max() < 1e-6  # a constant channel: centred, not magnified by a zero deviation
    for path in (root / "test").rglob("*.png"):
        Image.new("RGB", (7, 4)).save(path)
    with pytest.raises(
        DataError,
        match=r"test images are 4x7 with 3 channel\(s\) .* but training images are 5x6 with 3 channel\(s\) in RGB$",
    ):
        _loader().load(str(root))


def test_a_file_pillow_cannot_read_is_named_with_what_pillow_said(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    bad = root / "train" / "a" / "2.png"
    _text(bad)
    with pytest.raises(DataError) as caught:
        _loader().load(str(root))
    assert str(caught.value) == (
        f"imagefolder: {bad} cannot be read as an image (UnidentifiedImageError: cannot identify image file "
        f"'{bad}'); remove or replace it"
    )
