"""What real image folders hold besides images: a file that is not one is refused by name, a stray file skipped.

``fedsketch run`` and ``plan`` (their ``main``, in this process) on a folder of
small PNGs with one odd file each.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from experiments.cli import main
from fedsketch.data import folder
from fedsketch.data.checks import DataError


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
    *_, classes, note = folder.load(str(_folder(tmp_path)))
    assert classes == 2 and note == ""


@pytest.mark.parametrize("strays", [3, 5])
def test_the_note_names_three_skipped_files_and_counts_the_rest(tmp_path: Path, strays: int) -> None:
    root = _folder(tmp_path)
    for i in range(strays):
        (root / "train" / "a" / f"n{i}.txt").write_text("x", encoding="utf-8")
    *_, note = folder.load(str(root))
    more = f" and {strays - 3} more" if strays > 3 else ""
    assert note.startswith(f"skipped {strays} file(s) without an image extension (.jpg, ")
    assert note.endswith(f"): train/a/n0.txt, train/a/n1.txt, train/a/n2.txt{more}")


def test_test_images_of_another_size_or_mode_are_refused_with_both_shapes(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    for path in (root / "test").rglob("*.png"):
        Image.new("RGB", (7, 4), (1, 2, 3)).save(path)
    first = min((root / "test" / "a").glob("*.png"))
    with pytest.raises(DataError) as caught:
        folder.load(str(root))
    assert str(caught.value) == (
        f"imagefolder:{root}: test images are 4x7 with 3 channel(s) ({first}) but training images are 5x6 with "
        "1 channel(s) in L"
    )
