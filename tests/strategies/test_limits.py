"""A reply's arrays are read in place: views of the bytes a client sent, checked in one pass.

``strategies.limits.checked_array`` returns a read-only view of an ``Array``'s bytes (no copy of a
10 MB sketch per client, as on the paper's CIFAR-10 shape), unless the data sits at an address its
dtype cannot be read from; ``strategies.replies.check_values`` takes both extremes in one pass with
torch, or with numpy for a float type torch does not have.
"""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedsketch.algorithms.aggregate import weighted_mean
from strategies.limits import checked_array, checked_payload, decode_all, for_layout, quiet_read_only_views, spec_bytes
from strategies.replies import check_values

ROOT = Path(__file__).resolve().parents[2]


def npy_bytes(arr: np.ndarray, header_len: int | None = None, fortran: bool = False) -> bytes:
    """``arr`` as a version 1.0 ``.npy`` file, whatever numpy itself would write: ``header_len`` pads its header to
    that length (odd ones misalign), ``fortran`` says its data is Fortran-ordered."""
    descr = np.lib.format.dtype_to_descr(arr.dtype)
    header = repr({"descr": descr, "fortran_order": fortran, "shape": arr.shape}).encode("latin1")
    size = header_len if header_len is not None else 128 - 10
    header = header + b" " * (size - len(header) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + arr.tobytes()


def npy(arr: np.ndarray, version: tuple[int, int] = (1, 0)) -> bytes:
    """``arr`` as numpy writes it, in that ``.npy`` version."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


STRUCTURED = np.dtype([("aaaaaaaaaa", "<f4"), ("bbbbbbbbbb", "<f4")])
LONG = str(STRUCTURED)  # a structured dtype's name, 46 characters
NINE = (1,) * 9


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (
            Array("float32", (2,), "torch.Tensor" + "x" * 40, npy(np.zeros(2, np.float32))),
            "array 'x' is serialized as 'torch.Tensor" + "x" * 28 + "', not numpy",
        ),
        (
            Array("float32", (2,), "numpy.ndarray", b"\x93NUMPY\x03\x00" + npy(np.zeros(2, np.float32))[8:]),
            "array 'x' has no valid npy header (ValueError)",
        ),
        (
            Array("float32", (2,), "numpy.ndarray", npy_bytes(np.zeros(2, np.float32), header_len=5000)),
            "array 'x' has no valid npy header (ValueError)",
        ),  # beyond MAX_HEADER, which numpy's 10,000 would allow
        (
            Array("complex64", (2,), "numpy.ndarray", npy(np.zeros(2, np.complex64))),
            "array 'x' has dtype complex64; expected a native bool, int or float",
        ),
        (
            Array(">f4", (2,), "numpy.ndarray", npy_bytes(np.zeros(2, ">f4"))),
            "array 'x' has dtype >f4; expected a native bool, int or float",
        ),
        (
            Array("object", (1,), "numpy.ndarray", npy_bytes(np.zeros(1, object))),
            "array 'x' has dtype object; expected a native bool, int or float",
        ),
        (
            Array(LONG, (1,), "numpy.ndarray", npy_bytes(np.zeros(1, STRUCTURED))),
            f"array 'x' has dtype {LONG[:40]}; expected a native bool, int or float",
        ),
        (
            Array("float32", (2,), "numpy.ndarray", npy_bytes(np.zeros(2, np.float32), fortran=True)),
            "array 'x' is Fortran-ordered",
        ),
        (
            Array("float32", (2,), "numpy.ndarray", npy(np.zeros(2, np.float32)) + b"\x00"),
            "array 'x' has 9 data bytes; its header says 8",
        ),
        (
            Array("int64", (3,), "numpy.ndarray", npy(np.zeros(3, np.int64))[:-8]),
            "array 'x' has 16 data bytes; its header says 24",
        ),
        (
            Array("float32", (2,), "numpy.ndarray", npy(np.zeros(2, np.int32))),
            "array 'x' declares float32[2] but holds int32[2]",
        ),
        (
            Array("int32", (3,), "numpy.ndarray", npy(np.zeros(2, np.int32))),
            "array 'x' declares int32[3] but holds int32[2]",
        ),
        (
            Array("float32" + "0" * 40, NINE, "numpy.ndarray", npy(np.zeros(NINE, np.int8))),
            f"array 'x' declares {('float32' + '0' * 40)[:40]}{[1] * 8} but holds int8{[1] * 8}",
        ),
    ],
    ids=[
        "stype",
        "version-3",
        "long-header",
        "complex",
        "big-endian",
        "object",
        "structured",
        "fortran",
        "data-long",
        "data-short",
        "dtype",
        "shape",
        "nine-dims",
    ],
)
def test_a_malformed_array_is_refused_naming_it_and_what_is_wrong(array: Array, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        checked_array("x", array)
    assert str(refused.value) == message


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_an_honest_array_of_either_npy_version_is_read(version: tuple[int, int]) -> None:
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert np.array_equal(checked_array("x", Array("int16", (2, 3), "numpy.ndarray", npy(arr, version))), arr)
    big = np.zeros(2, np.dtype([(f"f{i:03d}", "<f4") for i in range(300)]))  # a header over 4,096 bytes
    with pytest.raises(ValueError, match=r"^array 'y' has no valid npy header \(ValueError\)$"):
        checked_array("y", Array(str(big.dtype), (2,), "numpy.ndarray", npy(big, version)))


def test_a_payload_that_is_no_record_of_arrays_is_refused_naming_the_entry() -> None:
    with pytest.raises(ValueError, match=r"^update is a ConfigRecord, not an ArrayRecord$"):
        checked_payload(ConfigRecord({"a": 1}), 10**6, 4)
    not_bytes, no_data = Array(np.zeros(2, np.float32)), Array(np.zeros(2, np.float32))
    not_bytes.data = "abc"  # type: ignore[assignment]
    del no_data.data
    bad = Array("float32", (2,), "numpy.ndarray", npy(np.zeros(2, np.int32)))
    for array, message in [
        (not_bytes, r"^entry 'w' is not an array$"),
        (no_data, r"^entry 'w' is not an array$"),
        (bad, r"^array 'w' declares float32\[2\] but holds int32\[2\]$"),
    ]:
        record = ArrayRecord()
        record["v"], record["w"] = Array(np.zeros(2, np.float32)), array
        with pytest.raises(ValueError, match=message):
            checked_payload(record, 10**6, 4)


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


def test_quieting_read_only_views_swallows_that_warning_alone() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_read_only_views()
        warnings.warn("The given NumPy array is not writable, and PyTorch does not support them", UserWarning)
        warnings.warn("The given NumPy array is not writable", RuntimeWarning)
        warnings.warn("another warning", UserWarning)
    assert [(str(w.message), w.category) for w in caught] == [
        ("The given NumPy array is not writable", RuntimeWarning),
        ("another warning", UserWarning),
    ]


def test_a_decoder_may_walk_the_payload_and_arrays_it_never_reads_are_named_eight_at_most() -> None:
    payload = {f"a{i}": np.zeros(1, np.float32) for i in range(10)}
    assert decode_all(lambda view: sorted(view[name].size for name in view), payload) == [1] * 10
    with pytest.raises(
        ValueError, match=r"^payload has arrays \['a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'a7', 'a8'\] that"
    ):
        decode_all(lambda view: view["a0"], payload)  # nine unread


def test_a_fixed_layout_bounds_a_reply_by_its_own_size_and_a_decoder_by_twice_the_dense_model() -> None:
    spec = {"table": ((3, 50), np.dtype(np.float32)), "idx": ((7,), np.dtype(np.int64))}
    fixed = for_layout(spec, {"sketch-seed": 4}, 1000, 60, 12)
    assert (fixed.max_bytes, fixed.max_arrays) == (spec_bytes(list(spec.values())), 2)
    assert (fixed.max_examples, fixed.echo, fixed.num_clients, fixed.merged) == (60, {"sketch-seed": 4}, 12, False)
    decoded = for_layout(lambda payload: payload, {}, 1000, 60, 12, merged=True)
    assert (decoded.max_bytes, decoded.max_arrays, decoded.num_clients, decoded.merged) == (
        2 * 1000 + 2**16,
        16,
        12,
        True,
    )


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
