"""Every dataset by name: its input shape, number of classes and where its files go.

One table for the config's choices, the loaders and the checks made before
training (which build the model from the shape without reading any data).
``npz``, ``imagefolder``, ``huggingface`` and a loader of the user's own (``package.module:function``,
not in this table) are known only once read.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsketch.data import text
from fedsketch.data.synthetic import NUM_CLASSES, NUM_FEATURES


@dataclass(frozen=True)
class DatasetInfo:
    """What is known of a dataset before reading it."""

    input_shape: tuple[int, ...] | None  # None: known only from the files (npz)
    num_classes: int | None
    files: str = ""  # the layout expected under ``data-root`` (image sets read from local files)
    model: str = ""  # the one model that reads it, which reads nothing else ("": any model that fits its shape)


DATASETS: dict[str, DatasetInfo] = {
    "synthetic": DatasetInfo((NUM_FEATURES,), NUM_CLASSES),
    "synthetic_text": DatasetInfo((text.DOC_LEN,), text.NUM_CLASSES, model="bag"),
    "mnist": DatasetInfo((1, 28, 28), 10, "MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"),
    "mnist_t10k": DatasetInfo((1, 28, 28), 10, "{,MNIST/raw/}t10k-{images-idx3,labels-idx1}-ubyte[.gz]"),
    "fashion_mnist": DatasetInfo((1, 28, 28), 10, "FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"),
    "cifar10": DatasetInfo((3, 32, 32), 10, "cifar-10-batches-py/{data_batch_1..5,test_batch}"),
    "cifar100": DatasetInfo((3, 32, 32), 100, "cifar-100-python/{train,test}"),
    "femnist": DatasetInfo((1, 28, 28), 62),
    "npz": DatasetInfo(None, None),
    "imagefolder": DatasetInfo(None, None, "train/<class>/<image>, test/<class>/<image>"),
    "huggingface": DatasetInfo(None, None, "a folder written by save_to_disk, or a hub name"),
}
NAMES: tuple[str, ...] = tuple(DATASETS)


def num_classes(name: str) -> int:
    """The number of classes of a dataset whose classes are fixed.

    Raises
    ------
    ValueError
        For a dataset whose classes are known only from its files (``npz``).
    """
    classes = DATASETS[name].num_classes
    if classes is None:
        raise ValueError(f"dataset {name!r} has no fixed number of classes: read it from the data")
    return classes
