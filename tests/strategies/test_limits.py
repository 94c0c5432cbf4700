"""A reply's arrays are read in place: views of the bytes a client sent, checked in one pass.

``strategies.limits.checked_array`` returns a read-only view of an ``Array``'s bytes (no copy of a
10 MB sketch per client, as on the paper's CIFAR-10 shape), unless the data sits at an address its
dtype cannot be read from; ``strategies.replies.check_values`` takes both extremes in one pass with
torch, or with numpy for a float type torch does not have.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array

from fedsketch.algorithms.aggregate import weighted_mean
from strategies.limits import checked_array
from strategies.replies import check_values

ROOT = Path(__file__).resolve().parents[2]


def npy_bytes(arr: np.ndarray, header_len: int | None = None) -> bytes:
    """``arr`` as a version 1.0 ``.npy`` file; ``header_len`` pads its header to that length (odd ones misalign)."""
    header = repr({"descr": arr.dtype.str, "fortran_order": False, "shape": arr.shape}).encode("latin1")
    size = header_len if header_len is not None else 128 - 10
    header = header + b" " * (size - len(header) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + arr.tobytes()


def test_an_array_is_a_read_only_view_of_the_bytes_it_came_in() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = npy_bytes(arr)
    out = checked_array("table", Array("float32", (3, 4), "numpy.ndarray", data))
    assert np.array_equal(out, arr) and out.dtype == np.float32 and out.shape == (3, 4)
    assert np.shares_memory(out, np.frombuffer(data, np.uint8))
    assert not out.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        out[0, 0] = 1.0


def test_data_at_an_odd_offset_is_copied_to_an_aligned_array() -> None:
    arr = np.array([1.5, -2.0, 3.25], np.float64)
    data = npy_bytes(arr, header_len=117)  # 10 + 117 = 127: the data starts at an odd offset
    out = checked_array("v", Array("float64", (3,), "numpy.ndarray", data))
    assert np.array_equal(out, arr) and out.flags.aligned
    assert not np.shares_memory(out, np.frombuffer(data, np.uint8))


def test_views_sum_like_copies_and_are_never_written() -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 50), dtype=np.float32) for _ in range(3)]
    datas = [npy_bytes(a) for a in arrays]
    views = [checked_array("t", Array("float32", (2, 50), "numpy.ndarray", d)) for d in datas]
    merged = weighted_mean(views, [1.0, 2.0, 3.0])
    assert torch.equal(merged, weighted_mean([a.copy() for a in arrays], [1.0, 2.0, 3.0]))
    assert all(np.array_equal(v, a) for v, a in zip(views, arrays, strict=True))


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 on this platform")
@pytest.mark.parametrize(("values", "message"), [([1.0, np.nan], "NaN or Inf"), ([-5.0, 1.0], "beyond"), ([4.0], None)])
def test_a_float_type_torch_lacks_is_checked_with_numpy(values: list[float], message: str | None) -> None:
    arr = np.array(values, np.longdouble)
    if message is None:
        check_values("q", arr, 4.0)
        return
    with pytest.raises(ValueError, match=f"^array 'q' has .*{message}"):
        check_values("q", arr, 4.0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_one_bad_value_in_a_long_array_is_found(dtype: type) -> None:
    for bad, message in ((np.nan, "NaN or Inf"), (-np.inf, "NaN or Inf"), (-5.0, "beyond")):
        for at in (0, 40_000, 99_999):
            arr = np.zeros(100_000, dtype)
            arr[at] = bad
            with pytest.raises(ValueError, match=message):
                check_values("t", arr, 4.0)


@pytest.mark.slow  # two fresh Pythons importing torch
def test_the_server_silences_only_torchs_warning_about_read_only_views() -> None:
    convert = "import numpy, torch; torch.as_tensor(numpy.frombuffer(b'1234', numpy.float32))"
    quiet = "from strategies.limits import quiet_read_only_views; quiet_read_only_views(); "
    other = "; import warnings; warnings.warn('another warning')"

    def stderr_of(code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-W", "default", "-c", code], check=False, capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert "The given NumPy array is not writable" in stderr_of(convert)
    quieted = stderr_of(quiet + convert + other)
    assert "not writable" not in quieted and "another warning" in quieted
