"""8x8 grayscale digits, generated: ten stroke templates, each writer with a slant and a pen of their own.

A stand-in for a small public image set (such as UCI's 8x8 handwritten digits) that needs no download.
"""

from __future__ import annotations

import numpy as np

SIDE = 8
WRITERS = 40
PER_WRITER = 40  # training images a writer draws; a fifth as many more go to the test split


def load(seed: int = 0) -> dict[str, np.ndarray]:
    """``x_train, y_train, x_test, y_test, client_ids`` (the writer of each training image), samples normalized.

    The data set is fixed (its own seed); ``seed`` is the run seed, which a loader may use or ignore.
    """
    rng = np.random.default_rng(2024)
    templates = rng.random((10, SIDE, SIDE)) < 0.35
    images, labels, writers = [], [], []
    for writer in range(WRITERS * 6 // 5):
        shift, ink = int(rng.integers(-1, 2)), 0.6 + 0.4 * rng.random()
        digits = rng.integers(0, 10, PER_WRITER)
        strokes = np.roll(templates[digits], shift, axis=2) * ink
        images.append(strokes + rng.normal(0.0, 0.25, strokes.shape))
        labels.append(digits)
        writers.append(np.full(PER_WRITER, writer))
    x = np.concatenate(images)[:, None].astype(np.float32)
    y, ids = np.concatenate(labels).astype(np.int64), np.concatenate(writers)
    x = (x - x.mean()) / x.std()
    train = ids < WRITERS  # the last writers' images are the test split
    return {
        "x_train": x[train],
        "y_train": y[train],
        "x_test": x[~train],
        "y_test": y[~train],
        "client_ids": ids[train],
    }
