"""The compressors' shared checks and seeds: exact bounds, exact messages, dtypes and values.

Each test pins one promise of :mod:`fedsketch.compress.common` (docs/mutation.md, "compress_wire"): every
bound is tried on both sides of its edge, every refusal is checked whole, and the seeds and generators
against numpy's and torch's own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsketch.compress import common as c


def test_a_vector_comes_back_float32_contiguous_and_detached() -> None:
    x = torch.tensor([[1.5, 2.0], [3.0, 4.0]], dtype=torch.float64, requires_grad=True)
    col = x[:, 0]  # float64, strided
    out = c.check_vector(col)
    assert out.dtype == torch.float32 and out.is_contiguous() and not out.requires_grad
    assert out.tolist() == [1.5, 3.0]
    assert c.check_vector(torch.ones(3), 3).tolist() == [1.0, 1.0, 1.0]


def test_the_longest_vector_is_taken_and_one_more_is_refused() -> None:
    longest = torch.empty(c.MAX_D, dtype=torch.float16, device="meta")  # no memory
    out = c.check_vector(longest, c.MAX_D)
    assert out.dtype == torch.float32 and out.shape == (c.MAX_D,)
    with pytest.raises(ValueError, match=r"^vector length 2147483648 exceeds 2147483647 \(int32 indices\)$"):
        c.check_vector(torch.empty(c.MAX_D + 1, device="meta"))


def test_bad_vectors_are_refused_with_the_whole_message() -> None:
    with pytest.raises(TypeError, match=r"^expected a floating-point torch.Tensor; got Tensor$"):
        c.check_vector(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"^expected a floating-point torch.Tensor; got ndarray$"):
        c.check_vector(np.zeros(3, np.float32))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^expected a non-empty 1-D vector; got shape \(2, 3\)$"):
        c.check_vector(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"^expected a non-empty 1-D vector; got shape \(0,\)$"):
        c.check_vector(torch.zeros(0))
    with pytest.raises(ValueError, match=r"^vector has length 3; expected d=4$"):
        c.check_vector(torch.zeros(3), 4)


def test_check_int_takes_its_bounds_and_refuses_one_past_them() -> None:
    assert c.check_int("n", 2, 2, 5) == 2
    assert c.check_int("n", 5, 2, 5) == 5
    assert c.check_int("n", 10**30, 0) == 10**30
    taken = c.check_int("n", np.int64(3), 0, 5)
    assert taken == 3 and type(taken) is int
    with pytest.raises(ValueError, match=r"^n must be in \[2, 5\]; got 1$"):
        c.check_int("n", 1, 2, 5)
    with pytest.raises(ValueError, match=r"^n must be in \[2, 5\]; got 6$"):
        c.check_int("n", 6, 2, 5)
    with pytest.raises(ValueError, match=r"^n must be in \[2\]; got 1$"):
        c.check_int("n", 1, 2)
    with pytest.raises(TypeError, match=r"^n must be an int; got True$"):
        c.check_int("n", True, 0)
    with pytest.raises(TypeError, match=r"^n must be an int; got 2.0$"):
        c.check_int("n", 2.0, 0)


def test_d_is_from_one_to_the_largest_int32() -> None:
    assert c.check_d(1) == 1
    assert c.check_d(2**31 - 1) == 2**31 - 1
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        c.check_d(0)
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 2147483648$"):
        c.check_d(2**31)


def test_bucket_sizes_and_their_counts() -> None:
    assert c.check_bucket_size(None) is None
    assert c.check_bucket_size(1) == 1
    with pytest.raises(ValueError, match=r"^bucket_size must be in \[1\]; got 0$"):
        c.check_bucket_size(0)
    assert c.num_buckets(10, None) == 1
    assert [c.num_buckets(d, 3) for d in (1, 3, 4, 9, 10)] == [1, 1, 2, 3, 4]


def test_require_names_the_method_the_array_and_what_was_expected() -> None:
    payload: c.Payload = {"b": np.zeros(2, np.float32), "a": np.zeros(3, np.uint8)}
    assert c.require(payload, "b", np.float32, (2,), "m") is payload["b"]
    with pytest.raises(ValueError, match=r"^m payload has no 'x' array; keys: \['a', 'b'\]$"):
        c.require(payload, "x", np.float32, (2,), "m")
    expected = r" \(do d and the settings match the sender's\?\)$"
    with pytest.raises(ValueError, match=r"^m payload 'b' is float32\[2\]; expected float64\[2\]" + expected):
        c.require(payload, "b", np.float64, (2,), "m")
    with pytest.raises(ValueError, match=r"^m payload 'b' is float32\[2\]; expected float32\[1, 2\]" + expected):
        c.require(payload, "b", np.float32, (1, 2), "m")


def test_seeds_are_checked_against_torchs_bound() -> None:
    assert c.check_seed(0, "m") == 0
    assert c.check_seed(2**63 - 1, "m") == 2**63 - 1
    torch.Generator().manual_seed(2**63 - 1)  # torch takes it
    with pytest.raises(ValueError, match=r"^m is randomized and needs a seed \(see derive_seed\)$"):
        c.check_seed(None, "m")
    with pytest.raises(ValueError, match=r"^seed must be in \[0, 9223372036854775807\]; got -1$"):
        c.check_seed(-1, "m")
    with pytest.raises(ValueError, match=r"^seed must be in \[0, 9223372036854775807\]; got 9223372036854775808$"):
        c.check_seed(2**63, "m")


def test_derive_seed_is_numpys_seed_sequence_modulo_two_to_the_63() -> None:
    for parts in [(0, 5, 17), (7,), (1, 2, 3, 4), (2**40, 0)]:
        state = np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)
        assert c.derive_seed(*parts) == int(state[0]) % 2**63
        assert type(c.derive_seed(*parts)) is int
    top_bit = [p for p in range(200) if int(np.random.SeedSequence([p]).generate_state(1, np.uint64)[0]) >= 2**63]
    assert top_bit, "some part has the top bit set"
    assert (
        c.derive_seed(top_bit[0]) == int(np.random.SeedSequence([top_bit[0]]).generate_state(1, np.uint64)[0]) - 2**63
    )
    with pytest.raises(ValueError, match=r"^derive_seed needs at least one part$"):
        c.derive_seed()
    with pytest.raises(ValueError, match=r"^part 1 must be in \[0\]; got -1$"):
        c.derive_seed(0, -1)
    with pytest.raises(ValueError, match=r"^part 0 must be in \[0\]; got -2$"):
        c.derive_seed(-2, 0)
    with pytest.raises(TypeError, match=r"^part 2 must be an int; got 1.5$"):
        c.derive_seed(0, 0, 1.5)  # type: ignore[arg-type]


def test_a_generator_is_torchs_stream_for_the_seed_on_the_cpu() -> None:
    gen = c.generator(12345)
    assert gen.device == torch.device("cpu")
    expected = torch.rand(5, generator=torch.Generator().manual_seed(12345))
    assert torch.equal(torch.rand(5, generator=gen), expected)
    assert torch.equal(torch.rand(5, generator=c.generator(12345, "cpu")), expected)


def test_scalars_are_a_flat_float32_array() -> None:
    one = c.scalars(torch.tensor(2.5, dtype=torch.float64))
    assert one.dtype == np.float32 and one.shape == (1,) and one.tolist() == [2.5]
    many = c.scalars(torch.tensor([[0.1, 2.0], [3.0, 4.0]], dtype=torch.float64, requires_grad=True))
    assert many.dtype == np.float32 and many.shape == (4,)
    assert many.tolist() == [np.float32(0.1), 2.0, 3.0, 4.0]


def test_payload_nbytes_adds_every_arrays_bytes() -> None:
    payload: c.Payload = {"a": np.zeros(3, np.float32), "b": np.zeros(5, np.uint8), "c": np.zeros((2, 2), np.int64)}
    assert c.payload_nbytes(payload) == 12 + 5 + 32
    assert c.payload_nbytes({}) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_generator_asked_for_cuda_is_on_cuda() -> None:
    gen = c.generator(12345, "cuda")
    assert gen.device.type == "cuda"
    assert torch.rand(3, generator=gen, device="cuda").device.type == "cuda"
