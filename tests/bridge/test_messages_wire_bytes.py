"""``wire_bytes`` equals the length of what Flower deflates, object by object, for every kind of record.

The reference below walks Flower's own objects: ``len(obj.deflate())`` plus,
recursively, each child that Flower names (by its SHA-256 id, so identical
arrays in a record, or identical chunks of an array, once). ``wire_bytes``
works the same lengths out from sizes; they must agree to the byte.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from bridge.messages import MAX_CHUNK, client_metrics, model_record, payload_bytes, payload_to_record, wire_bytes
from fedsketch import wire


def deflated(obj: Any) -> int:
    """What Flower serializes for ``obj`` and its children, each distinct child once."""
    if isinstance(obj, RecordDict):
        return sum(deflated(record) for record in obj.values())
    children = obj.children or {}
    return len(obj.deflate()) + sum(deflated(child) for child in children.values())


def fresh(record: ArrayRecord) -> ArrayRecord:
    """A copy whose objects have never been named (no cached ids)."""
    return ArrayRecord({name: Array(a.dtype, tuple(a.shape), a.stype, bytes(a.data)) for name, a in record.items()})


RNG = np.random.default_rng(0)


def _marked(shape: tuple[int, ...]) -> np.ndarray:
    """Ones, with one value changed in every chunk: no two chunks alike."""
    arr = np.ones(shape, np.float32)
    arr.reshape(-1)[:: MAX_CHUNK // 4] = np.arange(2, 2 + arr.size // (MAX_CHUNK // 4) + 1)
    return arr


CASES = {
    "a model": model_record(RNG.standard_normal(299_018).astype(np.float32)),
    "an empty record": ArrayRecord({}),
    "an empty array and a 3-d int one": ArrayRecord(
        {"x": Array(np.zeros(0, np.int64)), "y y": Array(RNG.integers(0, 5, (3, 4, 5)))}
    ),
    "identical arrays under two names": ArrayRecord(
        {
            "a": Array(np.zeros(10, np.float32)),
            "b": Array(np.zeros(10, np.float32)),
            "c": Array(np.zeros(10, np.float64)),
        }
    ),
    "a sparse payload": payload_to_record(
        {"idx": np.arange(0, 3000, 3, dtype=np.int64), "val": RNG.standard_normal(1000).astype(np.float32)}
    ),
    "two chunks": ArrayRecord({"w": Array(RNG.standard_normal(MAX_CHUNK // 4 + 7).astype(np.float32))}),
    "identical chunks (zeros over 3 chunks)": ArrayRecord({"z": Array(np.zeros(MAX_CHUNK, np.float32))}),
    "an 11 x 10^6 table of nine distinct chunks": ArrayRecord({"t": Array(_marked((11, 10**6)))}),
    "the same bytes under two dtypes and shapes": ArrayRecord(
        {
            "f": Array("float32", (4,), "numpy.ndarray", np.arange(4, dtype=np.float32).tobytes()),
            "i": Array("int32", (4,), "numpy.ndarray", np.arange(4, dtype=np.float32).tobytes()),
            "m": Array("float32", (2, 2), "numpy.ndarray", np.arange(4, dtype=np.float32).tobytes()),
        }
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_array_records_count_what_flower_deflates(name: str) -> None:
    record = CASES[name]
    assert wire_bytes(fresh(record)) == deflated(fresh(record))


def test_identical_chunks_and_arrays_are_counted_once_as_flower_sends_them() -> None:
    zeros = CASES["identical chunks (zeros over 3 chunks)"]
    assert wire_bytes(zeros) < zeros["z"].data.__len__()  # the second and third chunks are the same bytes
    pair = CASES["identical arrays under two names"]
    one = ArrayRecord({"a": pair["a"], "c": pair["c"]})
    assert 0 < wire_bytes(pair) - wire_bytes(one) < 100  # one more name and id, no more data


def test_a_whole_reply_counts_each_record() -> None:
    content = RecordDict(
        {
            wire.update_key(3): payload_to_record({"update": RNG.standard_normal(5000).astype(np.float32)}),
            wire.metrics_key(3): client_metrics(64, 0.5, 0.1),
            wire.CONFIG_KEY: ConfigRecord({"round": 2, wire.CIDS: [3, 4]}),
            "m": MetricRecord({"x": 1.5}),
        }
    )
    assert wire_bytes(content) == deflated(content)
    assert wire_bytes(content) == sum(wire_bytes(record) for record in content.values())


@pytest.mark.parametrize("seed", range(20))
def test_random_records(seed: int) -> None:
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.float16]
    arrays = {}
    for i in range(int(rng.integers(1, 6))):
        shape = tuple(int(n) for n in rng.integers(0, 40, int(rng.integers(0, 4))))
        arr = np.asarray(rng.standard_normal(shape) * 100)
        arrays[f"arr-{i}" * int(rng.integers(1, 4))] = Array(arr.astype(rng.choice(dtypes)))
    if rng.random() < 0.5:  # a repeat of an earlier one under a new name
        arrays["again"] = next(iter(arrays.values()))
    record = ArrayRecord(arrays)
    assert wire_bytes(fresh(record)) == deflated(fresh(record))


def _repeats_its_first_chunk() -> np.ndarray:
    """Bytes whose second chunk is the first, header and all: Flower sends that chunk once."""
    n = 2 * MAX_CHUNK - 128
    arr = RNG.integers(0, 256, n, dtype=np.uint8)
    header = payload_to_record({"r": arr})["r"].data[:128]
    assert header.endswith(b"\n") and len(header) == 128  # np.save's header of this array, padded to 128 bytes
    arr[MAX_CHUNK - 128 :] = np.frombuffer(header + arr[: MAX_CHUNK - 128].tobytes(), np.uint8)
    return arr


FIELDS = np.dtype([(f"field_{i:04d}_" + "x" * 40, "f4") for i in range(1500)])
PAYLOADS = {
    "a sparse payload": lambda: {"idx": np.arange(0, 300, 3), "val": RNG.standard_normal(100).astype(np.float32)},
    "0-d, empty, bool and float16": lambda: {
        "s": np.array(2.5),
        "e": np.zeros(0, np.int32),
        "b": np.ones((2, 3), bool),
        "h": np.linspace(-1, 1, 9, dtype=np.float16),
    },
    "not C-contiguous and big-endian": lambda: {
        "t": np.arange(12, dtype=np.int32).reshape(3, 4).T,
        "b": np.arange(5, dtype=">f8"),
    },
    "identical arrays under two names": lambda: {
        "a": np.zeros(10, np.float32),
        "b": np.zeros(10, np.float32),
        "c": np.zeros(10, np.float64),
    },
    "two chunks": lambda: {"w": RNG.standard_normal(MAX_CHUNK // 4 + 7).astype(np.float32)},
    "a transposed array whose Fortran-order header is a block shorter": lambda: {
        "t": np.arange(300, dtype=np.uint8).reshape((100,) + (1,) * 12 + (3,)).T
    },
    "a chunk equal to the first, header and all": lambda: {"r": _repeats_its_first_chunk()},
    "a header that needs npy format 2.0": lambda: {"f": np.zeros(1, FIELDS), "g": np.ones(3, np.float32)},
}


@pytest.mark.filterwarnings("ignore:Stored array in format 2.0")
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_a_payload_counts_what_flower_deflates_for_its_record(name: str) -> None:
    """What a merged client would have sent, counted without building its record."""
    payload = PAYLOADS[name]()
    assert payload_bytes(payload) == deflated(payload_to_record(payload)) == wire_bytes(payload_to_record(payload))


def test_a_chunk_that_repeats_the_first_is_sent_once() -> None:
    arr = _repeats_its_first_chunk()
    assert payload_bytes({"r": arr}) < arr.nbytes  # the whole second chunk is left out
    other = arr.copy()
    other[-1] ^= 1
    assert payload_bytes({"r": other}) > arr.nbytes


def test_an_array_alone_counts_its_metadata_and_each_distinct_chunk() -> None:
    """Any Flower object is counted with what it references, not only a record."""
    for arr in (np.zeros(MAX_CHUNK // 2 + 9, np.float32), np.arange(10, dtype=np.int64)):
        assert wire_bytes(Array(arr)) == deflated(Array(arr))
