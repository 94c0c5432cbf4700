"""Images in torchvision's ``ImageFolder`` layout: ``ROOT/train/<class>/<image>`` and ``ROOT/test/<class>/<image>``.

The common way people hold their own images. Classes are the sub-folders of
``train`` in sorted order (torchvision's ``ImageFolder`` rule); ``test`` may hold
fewer of them, never others. Every image must have the same size; grayscale
sets stay one channel, anything else becomes RGB. Pixels are scaled to [0, 1]
and normalized per channel by the training split's mean and standard deviation (a constant channel is only centred).
Files are listed by torchvision (its image extensions) and read with Pillow.
A file with an image extension that Pillow cannot read (truncated, or not an
image at all) is refused by name; a file without one (``notes.txt``,
``.DS_Store``) is skipped, as torchvision's ``ImageFolder`` skips it, and
named in the load's notes so that the command can say so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from fedsketch.data.checks import DataError

Split = tuple[list[str], np.ndarray]
UNREADABLE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
"""What Pillow raises for a file it cannot decode: ``UnidentifiedImageError`` (an ``OSError``) for one that is
not an image, ``OSError`` for a truncated one, ``SyntaxError`` for a broken PNG chunk."""
FLAT = 1e-6
"""A channel whose deviation is below this is constant: dividing by it would only magnify rounding."""
SHOWN = 3
"""Skipped files named in the note; the rest are counted."""


def load(root: str, num_classes: int = 0) -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray, int, str]:
    """``x_train, y_train, x_test, y_test, classes, note`` of the folder ``root``; ``note`` names the files skipped
    for their extension (empty when none was).

    Raises
    ------
    FileNotFoundError
        If ``root/train`` or ``root/test`` is missing, or a class folder holds no image (naming the folder).
    DataError
        If a test class is not a training class, images differ in size, a file with an image extension cannot
        be read as an image (naming it), or ``num_classes`` (when not 0) differs from the number of class folders.
    """
    base = Path(root)
    for split in ("train", "test"):
        if not root or not (base / split).is_dir():
            raise FileNotFoundError(
                f"imagefolder: no folder {base / split}; set the data root to a folder holding "
                "train/<class>/<image> and test/<class>/<image>"
            )
    classes, index = find_classes(str(base / "train"))
    if num_classes and num_classes != len(classes):
        raise DataError(
            f"imagefolder:{root}: setting 'num-classes' is {num_classes} but train/ holds {len(classes)} class "
            f"folders ({', '.join(classes[:5])}{', ...' if len(classes) > 5 else ''})"
        )
    test_classes, _ = find_classes(str(base / "test"))
    if unknown := sorted(set(test_classes) - set(classes)):
        raise DataError(f"imagefolder:{root}: test/ has class folders that train/ lacks: {unknown}")
    train_files, y_train = _files(base / "train", index)
    test_files, y_test = _files(base / "test", index)
    x_train, x_test = _pixels(train_files), _pixels(test_files)
    mode = "L" if x_train.shape[1] == 1 else "RGB"
    if x_test.shape[1:] != x_train.shape[1:]:
        raise DataError(
            f"imagefolder:{root}: test images are {_describe(x_test.shape)} ({test_files[0]}) but training "
            f"images are {_describe(x_train.shape)} in {mode}"
        )
    mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
    std = x_train.std(dim=(0, 2, 3), keepdim=True)
    std = torch.where(std > FLAT, std, torch.ones_like(std))  # a constant channel is centred, not scaled
    note = _skipped(base, [*train_files, *test_files])
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test, len(classes), note


def _files(folder: Path, index: dict[str, int]) -> Split:
    try:  # torchvision refuses a class folder without an image, naming the class
        samples = make_dataset(str(folder), {c: i for c, i in index.items() if (folder / c).is_dir()}, IMG_EXTENSIONS)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"imagefolder: {folder}: {exc}") from None
    return [path for path, _ in samples], np.array([label for _, label in samples], dtype=np.int64)


def _pixels(files: list[str]) -> torch.Tensor:
    """Every image as float32 ``(N, C, H, W)`` in [0, 1]; one size for all, else the first that differs is named."""
    first = _read(files[0], None)
    size, gray = first.size, first.mode in ("L", "1", "I;16", "I")
    arrays = []
    for path in files:
        img = _read(path, "L" if gray else "RGB")
        if img.size != size:
            raise DataError(f"imagefolder: {path} is {img.size[0]}x{img.size[1]}; {files[0]} is {size[0]}x{size[1]}")
        arrays.append(np.asarray(img, dtype=np.float32))
    pixels = torch.from_numpy(np.stack(arrays)).div_(255.0)
    return pixels.unsqueeze(1) if gray else pixels.permute(0, 3, 1, 2).contiguous()


def _read(path: str, mode: str | None) -> Image.Image:
    """The image at ``path``, decoded (converted to ``mode`` if given); a file Pillow cannot decode is named."""
    try:
        with Image.open(path) as img:
            img.load()  # decode now: a truncated file fails here, not later
            return img.convert(mode) if mode else img.copy()
    except UNREADABLE as exc:
        raise DataError(
            f"imagefolder: {path} cannot be read as an image ({type(exc).__name__}: {exc}); remove or replace it"
        ) from None


def _skipped(base: Path, taken: list[str]) -> str:
    """The files under ``train/`` and ``test/`` that are not images by their extension, in one line ('' if none)."""
    kept = {str(Path(p)) for p in taken}
    stray = sorted(
        str(p.relative_to(base))
        for split in ("train", "test")
        for p in (base / split).rglob("*")
        if p.is_file() and str(p) not in kept
    )
    if not stray:
        return ""
    shown = ", ".join(stray[:SHOWN]) + (f" and {len(stray) - SHOWN} more" if len(stray) > SHOWN else "")
    return f"skipped {len(stray)} file(s) without an image extension ({', '.join(IMG_EXTENSIONS)}): {shown}"


def _describe(shape: torch.Size) -> str:
    return f"{shape[2]}x{shape[3]} with {shape[1]} channel(s)"
