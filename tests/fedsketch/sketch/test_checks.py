"""The Count Sketch's argument checks (``fedsketch/sketch/checks.py``): each bad argument refused with its exact
message, each boundary value accepted.

Written for the survivors of a mutation run (docs/mutation.md): a size of 1 and a seed of 0 pass, 0 and -1 do
not; ``True``, floats and strings are not ints; a sum that overflows to Inf is no reason to refuse finite values;
indices 0 and ``d - 1`` pass, -1 and ``d`` do not; bool, float and complex indices are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsketch.sketch.checks import DTYPES, check_finite, check_indices, check_table, check_vector, int_arg, same_device
from fedsketch.sketch.hashing import SERIAL_OP

CPU, META = torch.device("cpu"), torch.device("meta")


def test_a_size_of_one_and_a_seed_of_zero_are_accepted_as_plain_ints() -> None:
    assert int_arg("rows", 1) == 1
    assert int_arg("seed", 0, 0) == 0
    got = int_arg("cols", np.int64(7))
    assert got == 7 and type(got) is int
    assert int_arg("d", 2**40 + 1) == 2**40 + 1


@pytest.mark.parametrize(
    ("value", "low", "message"),
    [
        (0, 1, "rows must be positive; got 0"),
        (-3, 1, "rows must be positive; got -3"),
        (np.int32(0), 1, "rows must be positive; got 0"),
        (-1, 0, "rows must be non-negative; got -1"),
    ],
)
def test_a_size_below_its_bound_is_refused_with_its_message(value: object, low: int, message: str) -> None:
    with pytest.raises(ValueError) as err:
        int_arg("rows", value, low)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "bool"),
        (False, "bool"),
        (2.0, "float"),
        (np.float32(1.0), "float32"),
        ("3", "str"),
        (None, "NoneType"),
    ],
)
def test_a_size_that_is_not_an_int_is_refused_with_its_type(value: object, kind: str) -> None:
    with pytest.raises(TypeError) as err:
        int_arg("cols", value)
    assert str(err.value) == f"cols must be an int; got {kind}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_are_refused_with_the_arguments_name(dtype: torch.dtype, bad: float) -> None:
    vec = torch.tensor([0.0, bad, 1.0], dtype=dtype)
    with pytest.raises(ValueError) as err:
        check_finite("values", vec)
    assert str(err.value) == "values contains NaN or Inf"
    with pytest.raises(ValueError) as err:
        check_finite("table", vec.reshape(3, 1))
    assert str(err.value) == "table contains NaN or Inf"


def test_a_nan_in_any_piece_of_the_sums_is_refused() -> None:
    n = 2 * SERIAL_OP + 5  # three pieces of the CPU's piecewise sums
    for at in (0, SERIAL_OP - 1, SERIAL_OP, n - 1):
        vec = torch.zeros(n)
        vec[at] = float("nan")
        with pytest.raises(ValueError, match="^vec contains NaN or Inf$"):
            check_finite("vec", vec)


@pytest.mark.parametrize(("dtype", "big"), [(torch.float16, 60000.0), (torch.bfloat16, 3e38), (torch.float32, 3e38)])
def test_finite_values_whose_sum_overflows_are_accepted(dtype: torch.dtype, big: float) -> None:
    vec = torch.full((3,), big, dtype=dtype)
    assert torch.isfinite(vec).all() and not torch.isfinite(vec.sum())
    check_finite("vec", vec)
    check_finite("table", vec.reshape(3, 1))
    check_finite("vec", torch.full((SERIAL_OP + 1,), big, dtype=dtype))


def test_empty_and_single_values_are_checked() -> None:
    check_finite("vec", torch.zeros(0))
    check_finite("vec", torch.ones(1))
    with pytest.raises(ValueError, match="^vec contains NaN or Inf$"):
        check_finite("vec", torch.tensor([float("nan")]))


def test_a_table_of_each_dtype_is_accepted() -> None:
    for dtype in DTYPES:
        check_table(torch.ones(3, 4, dtype=dtype))


@pytest.mark.parametrize(
    ("table", "kind", "message"),
    [
        ([[1.0]], TypeError, "table must be a torch.Tensor; got list"),
        (np.ones((2, 2)), TypeError, "table must be a torch.Tensor; got ndarray"),
        (torch.ones(3), ValueError, "table must be 2-D (rows x cols); got shape (3,)"),
        (torch.ones(1, 2, 3), ValueError, "table must be 2-D (rows x cols); got shape (1, 2, 3)"),
        (
            torch.ones(2, 2, dtype=torch.int64),
            TypeError,
            f"table must be a floating-point tensor of {DTYPES}; got torch.int64",
        ),
        (
            torch.ones(2, 2, dtype=torch.complex64),
            TypeError,
            f"table must be a floating-point tensor of {DTYPES}; got torch.complex64",
        ),
        (torch.tensor([[1.0, float("nan")]]), ValueError, "table contains NaN or Inf"),
    ],
)
def test_a_bad_table_is_refused_with_its_message(table: object, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind) as err:
        check_table(table)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_a_good_vector_comes_back_detached_with_its_values() -> None:
    vec = torch.arange(5, dtype=torch.float64, requires_grad=True)
    got = check_vector("vec", vec, 5, CPU)
    assert not got.requires_grad and got.dtype == torch.float64 and torch.equal(got, vec.detach())


@pytest.mark.parametrize(
    ("vec", "kind", "message"),
    [
        ([1.0, 2.0], TypeError, "values must be a torch.Tensor; got list"),
        (torch.ones(2, 2), ValueError, "values must be a flat 1-D tensor; got shape (2, 2)"),
        (torch.tensor(1.0), ValueError, "values must be a flat 1-D tensor; got shape ()"),
        (torch.ones(3), ValueError, "values has length 3; expected 4"),
        (torch.ones(4, dtype=torch.int32), TypeError, "values must be a floating-point tensor; got torch.int32"),
        (torch.ones(4, device=META), ValueError, "values is on meta but the sketch is on cpu"),
        (torch.tensor([0.0, 1.0, float("inf"), 2.0]), ValueError, "values contains NaN or Inf"),
    ],
)
def test_a_bad_vector_is_refused_with_its_message(vec: object, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind) as err:
        check_vector("values", vec, 4, CPU)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_indices_at_both_ends_come_back_as_int64() -> None:
    for dtype in (torch.int32, torch.uint8, torch.int64):
        got = check_indices(torch.tensor([4, 0, 2], dtype=dtype), 5, CPU)
        assert got.dtype == torch.int64 and got.tolist() == [4, 0, 2]
    empty = check_indices(torch.zeros(0, dtype=torch.int32), 5, CPU)
    assert empty.dtype == torch.int64 and empty.numel() == 0


@pytest.mark.parametrize(
    ("indices", "kind", "message"),
    [
        ([0, 1], TypeError, "indices must be a torch.Tensor; got list"),
        (torch.tensor([0.0, 1.0]), TypeError, "indices must be an integer tensor; got torch.float32"),
        (
            torch.tensor([0, 1], dtype=torch.complex64),
            TypeError,
            "indices must be an integer tensor; got torch.complex64",
        ),
        (torch.tensor([True, False]), TypeError, "indices must be an integer tensor; got torch.bool"),
        (torch.zeros(2, 2, dtype=torch.int64), ValueError, "indices must be 1-D; got shape (2, 2)"),
        (torch.zeros(2, dtype=torch.int64, device=META), ValueError, "indices are on meta but the sketch is on cpu"),
        (torch.tensor([-1, 3]), ValueError, "indices must be in [0, d=5); got range [-1, 3]"),
        (torch.tensor([0, 5]), ValueError, "indices must be in [0, d=5); got range [0, 5]"),
        (torch.tensor([2, 7, -4]), ValueError, "indices must be in [0, d=5); got range [-4, 7]"),
    ],
)
def test_bad_indices_are_refused_with_their_message(indices: object, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind) as err:
        check_indices(indices, 5, CPU)  # type: ignore[arg-type]
    assert str(err.value) == message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_vector_is_checked_in_one_piece() -> None:
    cuda = torch.device("cuda")
    check_finite("vec", torch.ones(2 * SERIAL_OP + 5, device=cuda))
    check_finite("vec", torch.full((3,), 3e38, device=cuda))  # its sum overflows, its values are finite
    check_finite("vec", torch.zeros(0, device=cuda))
    with pytest.raises(ValueError, match="^vec contains NaN or Inf$"):
        check_finite("vec", torch.tensor([0.0, float("nan")], device=cuda))
    assert torch.equal(check_vector("vec", torch.ones(4, device=cuda), 4, cuda).cpu(), torch.ones(4))


def test_a_device_named_without_an_index_is_the_one_tensors_land_on() -> None:
    assert same_device(CPU, torch.device("cpu", 0)) and same_device(torch.device("cpu", 0), CPU)
    assert same_device(META, META) and not same_device(CPU, META) and not same_device(META, CPU)
    assert same_device(torch.device("cpu", 0), torch.device("cpu", 0))
    assert not same_device(torch.device("cpu", 0), torch.device("cpu", 1))
    ones = torch.ones(3)
    assert torch.equal(check_vector("vec", ones, 3, torch.device("cpu", 0)), ones)
    assert torch.equal(check_indices(torch.tensor([0, 2]), 3, torch.device("cpu", 0)), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="^vec is on cpu but the sketch is on meta$"):
        check_vector("vec", ones, 3, META)
