"""FEMNIST: handwritten digits and letters (62 classes), one client per writer.

LEAF (Caldas et al., 2018) groups EMNIST (Cohen et al., 2017) by writer; FetchSGD
(Rothchild et al., ICML 2020, Sec. 5) trains on it with about 3,500 clients. The
copy read here is Flower's Hugging Face dataset ``flwrlabs/femnist`` (columns
``image``, ``writer_id``, ``character``), from a local ``save_to_disk`` folder or,
with no folder, from the hub through flwr-datasets' ``FederatedDataset`` with a
``NaturalIdPartitioner`` on ``writer_id``. As in LEAF, a held-out 10% of each
kept writer's samples forms the test set; writers are numbered in sorted
``writer_id`` order and only the kept writers' images are decoded. Details:
docs/data.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

HUB_NAME = "flwrlabs/femnist"
TEST_FRACTION = 0.1  # LEAF's default train fraction is 0.9
_STREAM = 0xFE31
_SAVE_HINT = (
    'On a machine with internet run `python -c "from datasets import load_dataset; '
    "load_dataset('flwrlabs/femnist', split='train').save_to_disk('{root}')\"` and copy the folder here"
)


def open_femnist(root: str) -> Any:
    """The whole FEMNIST ``train`` split as a ``datasets.Dataset`` (local copy or hub)."""
    if root:
        return _open_local(Path(root))
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import NaturalIdPartitioner

    try:
        fds = FederatedDataset(
            dataset=HUB_NAME,
            partitioners={"train": NaturalIdPartitioner(partition_by="writer_id")},
            shuffle=False,
        )
        return fds.load_split("train")
    except Exception as exc:  # offline: say how to work without the hub
        raise FileNotFoundError(
            f"femnist: could not fetch {HUB_NAME} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
            "Set the data root to a saved copy instead. " + _SAVE_HINT.format(root="ROOT")
        ) from exc


def _open_local(root: Path) -> Any:
    import datasets

    if not (root / "dataset_info.json").is_file() and not (root / "dataset_dict.json").is_file():
        raise FileNotFoundError(
            f"femnist: no dataset saved with datasets' save_to_disk at {root} "
            f"(expected {root / 'dataset_info.json'}). " + _SAVE_HINT.format(root=root)
        )
    loaded = datasets.load_from_disk(str(root))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ValueError(f"femnist: {root} holds splits {list(loaded)}; expected a 'train' split")
        loaded = loaded["train"]
    missing = {"image", "writer_id", "character"} - set(loaded.column_names)
    if missing:
        raise ValueError(f"femnist: {root} lacks columns {sorted(missing)}; has {loaded.column_names}")
    return loaded


def split_rows(writers: np.ndarray, seed: int) -> np.ndarray:
    """True for the rows held out for testing: a random 10% (rounded down) of each writer's rows."""
    rng = np.random.default_rng([seed, _STREAM])
    _, group = np.unique(writers, return_inverse=True)
    order = np.lexsort((rng.random(size=int(writers.shape[0])), group))
    sizes = np.bincount(group)
    rank = np.arange(writers.shape[0]) - (np.cumsum(sizes) - sizes)[group[order]]
    test = np.zeros(writers.shape[0], dtype=bool)
    test[order] = rank < np.floor(TEST_FRACTION * sizes[group[order]])
    return test


def columns(dataset: Any) -> tuple[np.ndarray, np.ndarray]:
    """``writer_id`` and ``character`` of every row, without decoding images."""
    table = dataset.select_columns(["writer_id", "character"]).with_format("numpy")[:]
    return np.asarray(table["writer_id"]), np.asarray(table["character"], dtype=np.int64)


def images(dataset: Any, rows: np.ndarray) -> torch.Tensor:
    """Decode the images of ``rows`` into uint8 ``(n, 1, 28, 28)``."""
    if rows.size == 0:
        return torch.zeros((0, 1, 28, 28), dtype=torch.uint8)
    pixels = np.asarray(dataset.select(rows).select_columns(["image"]).with_format("numpy")[:]["image"])
    if pixels.ndim != 3 or pixels.shape[1:] != (28, 28) or pixels.dtype != np.uint8:
        raise ValueError(f"femnist: expected 28x28 grayscale uint8 images; got {pixels.dtype} {pixels.shape}")
    return torch.from_numpy(pixels).unsqueeze(1)
