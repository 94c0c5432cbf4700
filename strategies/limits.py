"""What a client's reply may be, and decoding its arrays without trusting them.

A reply's arrays arrive as Flower ``Array`` objects: a declared dtype and shape
beside raw bytes that are meant to be an ``.npy`` file. A hostile or broken
client controls all three independently. ``Array.numpy()`` hands the bytes to
``np.load``, which allocates what the *header inside the bytes* claims before
reading the data, so a 100-byte reply claiming ``float64[10**12]`` would ask for
8 TB. :func:`checked_array` instead bounds the bytes first, parses the header
with numpy's own reader, requires header, declared metadata and byte count to
agree, and only then reads the data in place: the array it returns is a
read-only view of the bytes, which live as long as it does.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from fedsketch.client.uploads import MAX_ABS
from fedsketch.methods.method import Layout

NUMERIC_KINDS = "biuf"  # bool, signed and unsigned ints, floats: what payloads are made of
MAX_HEADER = 4096  # an honest .npy header of a plain array is 128 bytes


@dataclass(frozen=True)
class ReplyLimits:
    """Bounds on one logical client's reply in one exchange.

    Attributes
    ----------
    max_examples
        The largest ``num-examples`` a client may claim (its weight in the mean).
    max_bytes
        The largest payload, summed over its arrays' raw bytes, checked before
        anything is decoded.
    max_arrays
        The most arrays a payload may have.
    max_abs
        The largest magnitude of any float value (see :data:`MAX_ABS`).
    echo
        Metrics the reply must repeat exactly, with the same type (e.g. the
        round's ``sketch-seed``: a table built with other hash functions would
        merge into garbage).
    num_clients
        Where a node names its own client (one client per node), the id must
        be below this.
    merged
        Whether a node may reply with its clients' uploads merged (``merge-uploads``).
    """

    max_examples: int
    max_bytes: int
    max_arrays: int = 16
    echo: dict[str, int | float | str] = field(default_factory=dict)
    num_clients: int | None = None
    max_abs: float = MAX_ABS
    merged: bool = False  # a node may merge its clients' uploads (``merge-uploads``, fedsketch/client/uploads.py)


def spec_bytes(shapes: list[tuple[tuple[int, ...], np.dtype]]) -> int:
    """The most raw bytes honest arrays of these shapes and dtypes take, headers included."""
    return sum(math.prod(shape) * np.dtype(dtype).itemsize + MAX_HEADER for shape, dtype in shapes)


def quiet_read_only_views() -> None:
    """Silence torch's one-time warning, when a read-only array becomes a tensor, that the tensor could write it.

    Decoded payloads are read-only views of the bytes that came in (:func:`checked_array`; the view saves a
    copy of every upload, docs/measurements/2026-11-26-h200-catch-up-billing.md); the server reads them and never
    writes them (screening makes new arrays), so the warning says nothing there. The ServerApp calls this
    once as it starts (tests: pyproject.toml's ``filterwarnings``).
    """
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


def checked_payload(record: object, max_bytes: int, max_arrays: int) -> dict[str, np.ndarray]:
    """The arrays of ``record``, each decoded by :func:`checked_array`.

    Raises
    ------
    ValueError
        If the record is not an ArrayRecord, has too many arrays or bytes, or
        any array is malformed.
    """
    if not isinstance(record, ArrayRecord):
        raise ValueError(f"update is a {type(record).__name__}, not an ArrayRecord")  # noqa: TRY004 -- the guard rejects on ValueError
    if len(record) > max_arrays:
        raise ValueError(f"payload has {len(record)} arrays; at most {max_arrays} allowed")
    total = 0
    for name, arr in record.items():
        data = getattr(arr, "data", None)
        if not isinstance(arr, Array) or not isinstance(data, bytes):
            raise ValueError(f"entry '{name}' is not an array")  # noqa: TRY004 -- as above
        total += len(data)
    if total > max_bytes:
        raise ValueError(f"payload is {total} bytes; at most {max_bytes} allowed")
    return {name: checked_array(name, arr) for name, arr in record.items()}


def checked_array(name: str, arr: Array) -> np.ndarray:
    """Decode one ``Array`` whose bytes are already bounded: a read-only view of them (copied only if misaligned).

    Raises
    ------
    ValueError
        If the serialization is not numpy, the header is malformed, the dtype is
        not a native-order bool/int/float, or header, declared shape and dtype
        and byte count disagree.
    """
    if arr.stype != "numpy.ndarray":
        raise ValueError(f"array '{name}' is serialized as {str(arr.stype)[:40]!r}, not numpy")
    data = arr.data
    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(buf, max_header_size=MAX_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(buf, max_header_size=MAX_HEADER)
        else:
            raise ValueError(f"npy version {version}")
    except Exception as exc:  # noqa: BLE001 -- numpy raises ValueError, SyntaxError, EOFError... on garbage
        raise ValueError(f"array '{name}' has no valid npy header ({type(exc).__name__})") from None
    if dtype.hasobject or dtype.kind not in NUMERIC_KINDS or not dtype.isnative or dtype.fields is not None:
        raise ValueError(f"array '{name}' has dtype {str(dtype)[:40]}; expected a native bool, int or float")
    if fortran:
        raise ValueError(f"array '{name}' is Fortran-ordered")
    if tuple(shape) != tuple(arr.shape) or str(dtype) != arr.dtype:
        raise ValueError(
            f"array '{name}' declares {str(arr.dtype)[:40]}{list(arr.shape)[:8]} but holds {dtype}{list(shape)[:8]}"
        )
    count = math.prod(shape)
    if len(data) != buf.tell() + count * dtype.itemsize:
        raise ValueError(
            f"array '{name}' has {len(data) - buf.tell()} data bytes; its header says {count * dtype.itemsize}"
        )
    view = np.frombuffer(data, dtype=dtype, count=count, offset=buf.tell()).reshape(shape)
    return view if view.flags.aligned else view.copy()  # a header of an odd length misaligns the data


class _Reads(Mapping[str, np.ndarray]):
    """A read-only view of a payload that remembers which arrays were looked at."""

    def __init__(self, payload: dict[str, np.ndarray]) -> None:
        self._payload = payload
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> np.ndarray:
        value = self._payload[key]
        self.read.add(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._payload)

    def __len__(self) -> int:
        return len(self._payload)


def decode_all(decoder: Callable[[dict[str, np.ndarray]], object], payload: dict[str, np.ndarray]) -> object:
    """``decoder(payload)``, refusing a payload with arrays the decoder never read.

    A decoder checks the arrays it needs; this makes sure there are no others
    (a layout with extra names is not the method's layout, whatever they hold).

    Raises
    ------
    ValueError
        Naming the arrays that were sent but not read.
    """
    view = _Reads(payload)
    decoded = decoder(view)  # type: ignore[arg-type]  # PayloadCheck says dict; decoders only read, as a Mapping
    unread = sorted(set(payload) - view.read)
    if unread:
        raise ValueError(f"payload has arrays {unread[:8]} that are not part of the method's layout")
    return decoded


def for_layout(
    layout: Layout, echo: dict[str, Any], dense_bytes: int, max_examples: int, clients: int, merged: bool = False
) -> ReplyLimits:
    """What one client's reply may be: an exact layout bounds its own size; a decoder gets twice the dense model's."""
    if callable(layout):
        max_bytes, max_arrays = 2 * dense_bytes + 2**16, 16
    else:
        max_bytes, max_arrays = spec_bytes(list(layout.values())), len(layout)
    return ReplyLimits(max_examples, max_bytes, max_arrays, echo, clients, merged=merged)
