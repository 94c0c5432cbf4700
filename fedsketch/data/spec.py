"""What data a run uses (:class:`DataSpec`) and what it gets (:class:`FederatedData`).

A spec is a small frozen value, so it can key the per-process cache of
:func:`fedsketch.data.load_federated`: the server and every simulated client
that ask for the same spec share one loaded, partitioned dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsketch.data.registry import NAMES as DATASETS
from fedsketch.settings import entry

if TYPE_CHECKING:
    import torch

FLWR_PARTITIONS = ("flwr-iid", "flwr-dirichlet", "flwr-pathological", "flwr-shard", "flwr-natural-id")
"""The partitions flwr-datasets' partitioners make (:mod:`fedsketch.data.flwr_partition`)."""
PARTITIONS = ("natural", "iid", "dirichlet", "pathological", "shards", *FLWR_PARTITIONS)


@dataclass(frozen=True)
class DataSpec:
    """The dataset and how its training samples are split over clients.

    Attributes
    ----------
    dataset
        ``synthetic`` (FedProx's Synthetic(alpha, beta), generated, no files),
        ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100`` (torchvision's
        folder layout under ``root``), ``mnist_t10k`` (MNIST's published test
        split alone, :data:`fedsketch.data.load.T10K_HOLDOUT` of it held out), ``femnist`` (LEAF's FEMNIST by writer,
        Hugging Face ``flwrlabs/femnist``), ``huggingface`` (any classification
        data set that ``datasets`` opens), or ``npz`` (your own arrays).
    root
        Folder holding the files (for ``npz``: the file itself; for
        ``huggingface``: a ``save_to_disk`` folder or a hub name). Empty for
        ``synthetic``; empty for ``femnist`` means "download from the hub".
    num_clients
        Number of clients the training samples are split over.
    partition
        ``natural`` (the data's own client ids: the generating device of
        Synthetic, the writer of FEMNIST, ``client_ids`` of an npz), ``iid``,
        ``dirichlet`` (label skew of concentration ``alpha``), ``pathological``
        (``classes_per_client`` classes each) or ``shards`` (McMahan et al.'s
        sorted-label shards, ``shards_per_client`` each), or one of flwr-datasets'
        partitioners (``flwr-iid``, ``flwr-dirichlet``, ``flwr-pathological``,
        ``flwr-shard``, ``flwr-natural-id``: :mod:`fedsketch.data.flwr_partition`).
    samples_per_client
        0 keeps every assigned sample; ``n > 0`` keeps at most ``n`` per client,
        chosen at random (FetchSGD's CIFAR-10 setup: 10,000 clients of 5 images).
    synthetic_alpha, synthetic_beta
        How much clients' models and features differ in Synthetic(alpha, beta).
    synthetic_devices
        Generating devices of Synthetic; 0 means one per client. A fixed number
        with a non-natural partition keeps the data pool fixed while the number
        of clients grows (large-client simulation, like CIFAR-10's 50,000
        images over 10,000 clients).
    seed
        Every random choice of generation and partitioning derives from it.
    num_classes
        The number of classes of data whose count is not fixed (``npz``,
        ``imagefolder``, a loader of your own); 0 infers it (largest label + 1).
    hf_features, hf_label, hf_client_id, hf_train_split, hf_test_split, hf_test_fraction
        ``huggingface`` only: the columns and splits read (:mod:`fedsketch.data.huggingface`).
    """

    dataset: str = "synthetic"
    root: str = ""
    num_clients: int = 100
    partition: str = "natural"
    alpha: float = 0.5
    classes_per_client: int = 2
    shards_per_client: int = 2
    samples_per_client: int = 0
    synthetic_alpha: float = 0.5
    synthetic_beta: float = 0.5
    synthetic_devices: int = 0
    seed: int = 0
    num_classes: int = 0
    hf_features: str = ""
    hf_label: str = "label"
    hf_client_id: str = ""
    hf_train_split: str = "train"
    hf_test_split: str = "test"
    hf_test_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS and not entry.is_reference(self.dataset):
            raise ValueError(f"unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        if self.partition not in PARTITIONS:
            raise ValueError(f"unknown partition {self.partition!r}; choose one of {', '.join(PARTITIONS)}")
        for name in (
            "num_clients",
            "classes_per_client",
            "shards_per_client",
            "samples_per_client",
            "seed",
            "synthetic_devices",
            "num_classes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(f"{name} must be an int; got {value!r}")
        for name in ("num_clients", "classes_per_client", "shards_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.synthetic_devices < 0:
            raise ValueError(f"synthetic_devices must be >= 0 (0: one per client); got {self.synthetic_devices}")
        if self.synthetic_devices not in (0, self.num_clients) and self.partition == "natural":
            raise ValueError(
                f"synthetic_devices ({self.synthetic_devices}) differs from num_clients ({self.num_clients}): "
                "the natural partition gives each client one device; choose another partition or set 0"
            )
        if self.samples_per_client < 0:
            raise ValueError(f"samples_per_client must be >= 0 (0 keeps all); got {self.samples_per_client}")
        if not self.alpha > 0:
            raise ValueError(f"alpha (Dirichlet concentration) must be > 0; got {self.alpha}")
        for name in ("synthetic_alpha", "synthetic_beta"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} is a standard deviation and must be >= 0; got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0 (numpy seeds are non-negative); got {self.seed}")
        check_huggingface(self.dataset, {name: getattr(self, name) for name in HF_DEFAULTS})


HF_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(DataSpec) if f.name.startswith("hf_")}
"""The settings that only ``dataset = "huggingface"`` reads, and their defaults (:mod:`fedsketch.data.huggingface`)."""


def check_huggingface(dataset: str, values: Mapping[str, Any]) -> None:
    """The ``hf-*`` settings (``values`` by field name): read by ``huggingface`` only (never ignored), a test
    fraction in [0, 1) that does not compete with a named test split.

    Raises
    ------
    ValueError
        Naming the setting.
    """
    changed = [name for name, default in HF_DEFAULTS.items() if values[name] != default]
    if dataset != "huggingface" and changed:
        raise ValueError(
            f"setting '{_key(changed[0])}' ({values[changed[0]]!r}) is read only by dataset 'huggingface'; "
            f"dataset is {dataset!r}, which would ignore it"
        )
    fraction = values["hf_test_fraction"]
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"setting 'hf-test-fraction' must be in [0, 1) (0: off); got {fraction}")
    if fraction and values["hf_test_split"] != HF_DEFAULTS["hf_test_split"]:
        raise ValueError(
            f"settings 'hf-test-fraction' ({fraction}) and 'hf-test-split' ({values['hf_test_split']!r}) "
            "both name the test set; keep one"
        )


def _key(name: str) -> str:
    return name.replace("_", "-")


@dataclass(frozen=True, eq=False)
class FederatedData:
    """A loaded dataset and its split over clients.

    Clients hold index arrays into one shared training tensor instead of copies,
    so 10,000 clients cost 10,000 small integer arrays, not 10,000 datasets.

    Attributes
    ----------
    train_x, train_y
        Every training sample (float32 ``(N, *input_shape)``) and label (int64 ``(N,)``).
    test_x, test_y
        The held-out set the server evaluates on.
    client_indices
        One read-only int64 array of indices into ``train_*`` per client.
    num_classes, input_shape, name
        What a model needs to know, and a label for logs.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    client_indices: tuple[np.ndarray, ...]
    num_classes: int
    input_shape: tuple[int, ...]
    name: str

    def __post_init__(self) -> None:
        import torch  # here, not at the top: a run's settings are checked without torch

        for split, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if x.dtype != torch.float32 or y.dtype != torch.int64:
                raise ValueError(f"{split} data must be float32 samples and int64 labels; got {x.dtype}, {y.dtype}")
            if x.shape[0] != y.shape[0] or y.ndim != 1:
                raise ValueError(f"{split} has {x.shape[0]} samples but labels of shape {tuple(y.shape)}")
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise ValueError(
                    f"{self.name}: {split} samples have shape {tuple(x.shape[1:])}; expected {self.input_shape}, "
                    "the training samples' shape"
                )
            if y.numel() and not 0 <= int(y.min()) <= int(y.max()) < self.num_classes:
                raise ValueError(
                    f"{split} labels must lie in [0, {self.num_classes}); got {int(y.min())}..{int(y.max())}"
                )
        if not self.client_indices:
            raise ValueError("a federated dataset needs at least one client")
        n = self.train_y.shape[0]
        for cid, idx in enumerate(self.client_indices):
            if idx.dtype != np.int64 or idx.ndim != 1:
                raise ValueError(f"client {cid}: indices must be a 1-D int64 array; got {idx.dtype}, {idx.ndim}-D")
            if idx.size and not 0 <= int(idx.min()) <= int(idx.max()) < n:
                raise ValueError(f"client {cid}: indices must lie in [0, {n})")
            idx.flags.writeable = False  # shared by every caller of the cache

    @property
    def num_clients(self) -> int:
        """How many clients the training set is split over."""
        return len(self.client_indices)

    def client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client ``cid``'s samples and labels (copies: the shared tensors stay intact).

        Raises
        ------
        ValueError
            If ``cid`` is outside ``[0, num_clients)``.
        TypeError
            If ``cid`` is not an integer.
        """
        if isinstance(cid, bool) or not isinstance(cid, int | np.integer):
            raise TypeError(f"client id must be an int; got {type(cid).__name__}")
        if not 0 <= cid < self.num_clients:
            raise ValueError(
                f"client id {cid} out of range: {self.name} has {self.num_clients} clients (0..{self.num_clients - 1})"
            )
        import torch

        idx = torch.tensor(self.client_indices[int(cid)])  # a copy: the array is read-only
        return self.train_x[idx], self.train_y[idx]
