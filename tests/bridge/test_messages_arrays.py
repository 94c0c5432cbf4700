"""A payload's arrays are encoded with one copy and checked without temporaries, and say the same as Flower's.

``bridge.messages.npy_array`` must give the very bytes ``flwr.app.Array(ndarray)``
gives (``np.save``'s), or a reply would count and decode differently;
``strategies.replies.check_values`` must reject exactly what
``np.isfinite(a).all()`` and ``abs(a).max() <= max_abs`` reject.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from bridge.messages import npy_array, payload_to_record, record_to_payload
from strategies.replies import check_values

ARRAYS = {
    "float32 vector": np.arange(7, dtype=np.float32),
    "float16 matrix": np.linspace(-1, 1, 12, dtype=np.float16).reshape(3, 4),
    "0-d": np.array(3.5),
    "empty int64": np.zeros(0, np.int64),
    "bool cube": np.ones((2, 3, 4), bool),
    "transposed (not C-contiguous)": np.arange(12, dtype=np.int32).reshape(3, 4).T,
    "a strided slice": np.arange(20, dtype=np.float64)[::3],
    "uint8": np.arange(256, dtype=np.uint8),
    "big-endian": np.arange(4, dtype=">f4"),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_npy_array_gives_flowers_bytes_and_the_arrays_shape(name: str) -> None:
    arr = ARRAYS[name]
    ours, flowers = npy_array(arr), Array(np.asarray(arr, order="C"))
    assert (ours.dtype, ours.shape, ours.stype) == (flowers.dtype, flowers.shape, flowers.stype)
    assert isinstance(ours.data, bytes) and ours.data == flowers.data
    back = record_to_payload(payload_to_record({"a": arr}))["a"]
    assert ours.shape == arr.shape == back.shape and back.dtype == arr.dtype  # a 0-d array stays 0-d
    np.testing.assert_array_equal(back, arr)


@pytest.mark.filterwarnings("ignore:Stored array in format 2.0")
def test_an_array_whose_header_needs_format_2_goes_through_flowers_own_path() -> None:
    arr = np.zeros((1,) * 20, np.dtype([(f"field_{i:04d}_" + "x" * 40, "f4") for i in range(1500)]))
    ours = npy_array(arr)
    assert ours.data == Array(arr).data and ours.data[6:8] == b"\x02\x00"  # npy format 2.0


VALUES = {
    "finite": (np.array([-3.0, 2.0], np.float32), None),
    "largest magnitude negative": (np.array([-5.0, 1.0], np.float32), "beyond"),
    "largest magnitude positive": (np.array([-1.0, 5.0], np.float32), "beyond"),
    "exactly the limit": (np.array([-4.0, 4.0], np.float32), None),
    "NaN first": (np.array([np.nan, 1.0, -9.0], np.float32), "NaN or Inf"),
    "NaN last": (np.array([1.0, -9.0, np.nan], np.float64), "NaN or Inf"),
    "-Inf": (np.array([0.0, -np.inf], np.float32), "NaN or Inf"),
    "+Inf": (np.array([np.inf, 0.0], np.float16), "NaN or Inf"),
    "Inf and NaN": (np.array([np.inf, np.nan], np.float32), "NaN or Inf"),
    "empty": (np.zeros(0, np.float32), None),
    "ints beyond (not checked: no float)": (np.array([10**6], np.int64), None),
}


@pytest.mark.parametrize("case", list(VALUES))
def test_check_values_rejects_what_the_elementwise_checks_reject(case: str) -> None:
    arr, expected = VALUES[case]
    elementwise = None
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        elementwise = "NaN or Inf"
    elif arr.dtype.kind == "f" and arr.size and float(np.abs(arr).max()) > 4.0:
        elementwise = "beyond"
    assert elementwise == expected  # the table says what the old checks said
    if expected is None:
        check_values("a", arr, 4.0)
    else:
        with pytest.raises(ValueError, match=f"array 'a' has .*{expected}"):
            check_values("a", arr, 4.0)
