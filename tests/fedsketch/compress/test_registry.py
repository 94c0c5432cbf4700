"""Every registered compressor: wire-safe payloads, checked options, seeds, no Flower; each bound as given.

The registry's promises (:mod:`fedsketch.compress.registry`, docs/mutation.md, "compress_wire"): a
bound compressor's name, length and bias flag, its options passed through unchanged (on inputs where
every option changes the payload, giving the same payloads and vectors as its module's functions), its
seed checks, and each refusal of :func:`~fedsketch.compress.get_compressor` whole.
"""

from __future__ import annotations

import ast
import io
from pathlib import Path

import numpy as np
import pytest
import torch

import fedsketch.compress as compress_pkg
from fedsketch.compress import (
    COMPRESSORS,
    derive_seed,
    gaussiank,
    get_compressor,
    identity,
    payload_nbytes,
    qsgd,
    random_k,
    signsgd,
    terngrad,
    topk,
)
from fedsketch.compress.common import Payload
from fedsketch.compress.registry import Compressor

D = 1000
OPTIONS: dict[str, dict[str, object]] = {
    "none": {},
    "topk": {"k": 20},
    "random_k": {"k": 20},
    "gaussiank": {"k": 20},
    "qsgd": {"s": 4},
    "terngrad": {},
    "signsgd": {},
}


def test_registry_lists_the_methods() -> None:
    assert set(COMPRESSORS) == set(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_payloads_survive_np_save_and_decode_to_float32(name: str) -> None:
    comp = get_compressor(name, D, **OPTIONS[name])
    x = torch.randn(D, generator=torch.Generator().manual_seed(0))
    payload = comp.compress(x, seed=9)
    restored = {}
    for key, arr in payload.items():
        assert isinstance(arr, np.ndarray) and arr.dtype != object and arr.ndim == 1, key
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        buf.seek(0)
        restored[key] = np.load(buf, allow_pickle=False)
    out = comp.decompress(restored, seed=9)
    assert out.dtype == torch.float32 and out.shape == (D,)
    torch.testing.assert_close(out, comp.decompress(payload, seed=9), rtol=0, atol=0)
    assert payload_nbytes(payload) < 4 * D or name == "none"


def test_identity_is_exact_and_biased_flags_are_right() -> None:
    x = torch.randn(D)
    comp = get_compressor("none", D)
    assert torch.equal(comp.decompress(comp.compress(x)), x)
    flags = {name: get_compressor(name, D, **opts).unbiased for name, opts in OPTIONS.items()}
    assert flags == {
        "none": True,
        "topk": False,
        "random_k": False,
        "gaussiank": False,
        "qsgd": True,
        "terngrad": True,
        "signsgd": False,
    }
    assert get_compressor("random_k", D, k=5, rescale=True).unbiased


def test_unknown_names_and_options_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"unknown compressor 'qsdg' \(did you mean 'qsgd'\?\)"):
        get_compressor("qsdg", D, s=4)
    with pytest.raises(ValueError, match=r"qsgd takes options \['bucket_size', 's'\]; unknown: \['k'\]"):
        get_compressor("qsgd", D, s=4, k=3)
    with pytest.raises(ValueError, match=r"missing: \['k'\]"):
        get_compressor("topk", D)


def test_option_values_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match=r"k must be in \[1, 1000\]"):
        get_compressor("topk", D, k=1001)
    with pytest.raises(ValueError, match=r"s must be in \[1, 255\]"):
        get_compressor("qsgd", D, s=256)
    with pytest.raises(ValueError, match=r"bucket_size must be in \[1"):
        get_compressor("signsgd", D, bucket_size=0)
    with pytest.raises(ValueError, match="adjust must be one of"):
        get_compressor("gaussiank", D, k=5, adjust="exact")
    with pytest.raises(TypeError, match="k must be an int"):
        get_compressor("random_k", D, k=2.5)
    with pytest.raises(ValueError, match=r"d must be in \[1"):
        get_compressor("none", 0)


def test_vectors_and_seeds_are_checked() -> None:
    comp = get_compressor("qsgd", D, s=4)
    with pytest.raises(ValueError, match="qsgd is randomized and needs a seed"):
        comp.compress(torch.zeros(D))
    with pytest.raises(ValueError, match="random_k is randomized and needs a seed"):
        get_compressor("random_k", D, k=3).decompress({"val": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="expected d=1000"):
        comp.compress(torch.zeros(D + 1), seed=0)
    with pytest.raises(ValueError, match="non-empty 1-D vector"):
        comp.compress(torch.zeros(10, 100), seed=0)
    with pytest.raises(TypeError, match="floating-point torch.Tensor"):
        comp.compress(torch.zeros(D, dtype=torch.int64), seed=0)


def test_derive_seed_is_a_fixed_function_of_its_parts() -> None:
    a = derive_seed(0, 5, 17)
    assert a == 61051975004544691  # numpy's SeedSequence hash is stable across versions
    assert len({a, derive_seed(0, 17, 5), derive_seed(1, 5, 17), derive_seed(0, 5, 18)}) == 4
    assert 0 <= a < 2**63
    with pytest.raises(ValueError, match=r"part 1 must be in \[0"):
        derive_seed(0, -1)


def test_the_package_never_imports_flower() -> None:
    for path in Path(compress_pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n == "flwr" or n.startswith("flwr.") for n in names), path


# each compressor bound as given: the same payloads and vectors as its module's functions --------------------


def spiky() -> torch.Tensor:
    """A vector where every option of every compressor changes its payload (checked below)."""
    x = torch.randn(D, generator=torch.Generator().manual_seed(3))
    x[::97] *= 8  # a few large, spread-out coordinates: varint wins for them
    x[1::50] = 0.0  # zeros for signSGD's random signs
    return x


def same(a: Payload, b: Payload) -> bool:
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def check_binding(comp: Compressor, name: str, unbiased: bool, payload: Payload, seed: int | None) -> None:
    """``comp`` is ``name`` of length D, sends ``payload`` for ``spiky()`` and decodes it as the module does."""
    assert (comp.name, comp.d, comp.unbiased) == (name, D, unbiased)
    assert same(comp.compress(spiky(), seed=seed), payload)


def test_none_is_the_dense_vector() -> None:
    comp = get_compressor("none", D)
    check_binding(comp, "none", True, identity.compress(spiky()), None)
    assert torch.equal(comp.decompress(identity.compress(spiky())), spiky())


@pytest.mark.parametrize("varint", [False, True])
def test_topk_passes_k_and_varint(varint: bool) -> None:
    comp = get_compressor("topk", D, k=11, varint=varint)
    payload = topk.compress(spiky(), k=11, varint=varint)
    check_binding(comp, "topk", False, payload, None)
    assert sorted(payload) == ["enc", "gaps" if varint else "idx", "val"]
    assert torch.equal(comp.decompress(payload), topk.decompress(payload, D))
    assert same(get_compressor("topk", D, k=11).compress(spiky()), topk.compress(spiky(), k=11))


@pytest.mark.parametrize("rescale", [False, True])
def test_random_k_passes_k_rescale_and_the_seed_both_ways(rescale: bool) -> None:
    comp = get_compressor("random_k", D, k=20, rescale=rescale)
    payload = random_k.compress(spiky(), k=20, seed=7, rescale=rescale)
    check_binding(comp, "random_k", rescale, payload, 7)
    decoded = comp.decompress(payload, seed=7)
    assert torch.equal(decoded, random_k.decompress(payload, D, seed=7))
    kept = decoded != 0
    scale = D / 20 if rescale else 1.0
    assert torch.equal(decoded[kept], spiky()[kept] * scale)
    assert not same(random_k.compress(spiky(), k=20, seed=7, rescale=True), random_k.compress(spiky(), k=20, seed=7))
    plain = get_compressor("random_k", D, k=20)
    assert not plain.unbiased and same(plain.compress(spiky(), seed=7), random_k.compress(spiky(), k=20, seed=7))


def test_random_k_needs_the_seed_to_send_and_to_decode() -> None:
    comp = get_compressor("random_k", D, k=3)
    message = r"^random_k is randomized and needs a seed \(see derive_seed\)$"
    with pytest.raises(ValueError, match=message):
        comp.compress(spiky())
    with pytest.raises(ValueError, match=message):
        comp.decompress({"val": np.zeros(3, np.float32)})


GAUSSIANK = [
    {},
    {"max_rounds": 1},
    {"adjust": "interpolate"},
    {"cap": False},
    {"varint": True},
    {"max_rounds": 1, "adjust": "interpolate", "cap": False, "varint": True},
]


@pytest.mark.parametrize("options", GAUSSIANK)
def test_gaussiank_passes_every_option(options: dict[str, object]) -> None:
    comp = get_compressor("gaussiank", D, k=20, **options)
    payload = gaussiank.compress(spiky(), k=20, **options)  # type: ignore[arg-type]
    check_binding(comp, "gaussiank", False, payload, None)
    assert torch.equal(comp.decompress(payload), gaussiank.decompress(payload, D))


def test_each_gaussiank_option_changes_the_payload() -> None:
    payloads = [gaussiank.compress(spiky(), k=20, **o) for o in GAUSSIANK]  # type: ignore[arg-type]
    assert all(not same(payloads[0], p) for p in payloads[1:])


def test_gaussiank_refuses_bad_options_by_name() -> None:
    with pytest.raises(ValueError, match=r"^max_rounds must be in \[1\]; got 0$"):
        get_compressor("gaussiank", D, k=5, max_rounds=0)
    with pytest.raises(ValueError, match=r"^adjust must be one of \('paper', 'interpolate'\); got 'exact'$"):
        get_compressor("gaussiank", D, k=5, adjust="exact")
    with pytest.raises(ValueError, match=r"^k must be in \[1, 1000\]; got 1001$"):
        get_compressor("gaussiank", D, k=1001)
    assert get_compressor("gaussiank", D, k=D).compress(spiky())["val"].size <= D


@pytest.mark.parametrize(("s", "bucket_size"), [(4, None), (4, 64), (1, 64)])
def test_qsgd_passes_s_the_bucket_size_and_the_seed(s: int, bucket_size: int | None) -> None:
    comp = get_compressor("qsgd", D, s=s, bucket_size=bucket_size)
    payload = qsgd.compress(spiky(), s=s, seed=5, bucket_size=bucket_size)
    check_binding(comp, "qsgd", True, payload, 5)
    assert torch.equal(comp.decompress(payload), qsgd.decompress(payload, D, s=s, bucket_size=bucket_size))
    assert not same(payload, qsgd.compress(spiky(), s=s, seed=6, bucket_size=bucket_size))


@pytest.mark.parametrize("bucket_size", [None, 64])
def test_terngrad_passes_the_bucket_size_and_the_seed(bucket_size: int | None) -> None:
    comp = get_compressor("terngrad", D, bucket_size=bucket_size)
    payload = terngrad.compress(spiky(), seed=5, bucket_size=bucket_size)
    check_binding(comp, "terngrad", True, payload, 5)
    assert torch.equal(comp.decompress(payload), terngrad.decompress(payload, D, bucket_size=bucket_size))
    assert not same(payload, terngrad.compress(spiky(), seed=6, bucket_size=bucket_size))


@pytest.mark.parametrize("bucket_size", [None, 64])
def test_signsgd_passes_the_bucket_size_and_random_zeros(bucket_size: int | None) -> None:
    comp = get_compressor("signsgd", D, bucket_size=bucket_size)
    payload = signsgd.compress(spiky(), bucket_size=bucket_size)
    check_binding(comp, "signsgd", False, payload, None)
    assert same(comp.compress(spiky(), seed=5), payload)  # the seed is ignored without random_zeros
    assert torch.equal(comp.decompress(payload), signsgd.decompress(payload, D, bucket_size=bucket_size))
    fair = get_compressor("signsgd", D, bucket_size=bucket_size, random_zeros=True)
    coins = signsgd.compress(spiky(), bucket_size=bucket_size, zero_seed=5)
    check_binding(fair, "signsgd", False, coins, 5)
    assert not same(coins, payload)


def test_signsgd_with_random_zeros_needs_a_seed() -> None:
    fair = get_compressor("signsgd", D, random_zeros=True)
    with pytest.raises(
        ValueError, match=r"^signsgd with random_zeros is randomized and needs a seed \(see derive_seed\)$"
    ):
        fair.compress(spiky())


@pytest.mark.parametrize(("name", "options"), [("qsgd", {"s": 4}), ("terngrad", {})])
def test_randomized_quantizers_need_a_seed(name: str, options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=rf"^{name} is randomized and needs a seed \(see derive_seed\)$"):
        get_compressor(name, D, **options).compress(spiky())


@pytest.mark.parametrize("name", ["qsgd", "terngrad", "signsgd"])
def test_bucket_sizes_are_checked_when_the_compressor_is_made(name: str) -> None:
    options: dict[str, object] = {"s": 4} if name == "qsgd" else {}
    with pytest.raises(ValueError, match=r"^bucket_size must be in \[1\]; got 0$"):
        get_compressor(name, D, bucket_size=0, **options)
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        get_compressor(name, 0, **options)
    with pytest.raises(ValueError, match=r"^s must be in \[1, 255\]; got 0$"):
        get_compressor("qsgd", D, s=0)


@pytest.mark.parametrize("name", ["topk", "random_k", "gaussiank"])
def test_k_is_checked_against_d_when_the_compressor_is_made(name: str) -> None:
    assert get_compressor(name, D, k=D).d == D
    with pytest.raises(ValueError, match=r"^k must be in \[1, 1000\]; got 0$"):
        get_compressor(name, D, k=0)
    with pytest.raises(ValueError, match=r"^k must be in \[1, 1000\]; got 1001$"):
        get_compressor(name, D, k=D + 1)
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        get_compressor(name, 0, k=1)


def test_a_compressor_checks_the_vector_it_is_given() -> None:
    comp = get_compressor("none", D)
    with pytest.raises(ValueError, match=r"^vector has length 999; expected d=1000$"):
        comp.compress(torch.zeros(D - 1))
    assert comp.compress(torch.ones(D, dtype=torch.float64))["update"].dtype == np.float32
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        get_compressor("none", 0)


def test_get_compressor_names_what_is_wrong_whole() -> None:
    known = r"known: \['gaussiank', 'none', 'qsgd', 'random_k', 'signsgd', 'terngrad', 'topk'\]$"
    with pytest.raises(ValueError, match=r"^unknown compressor 'topkk' \(did you mean 'topk'\?\); " + known):
        get_compressor("topkk", D, k=3)
    with pytest.raises(ValueError, match=r"^unknown compressor 'zzzz'; " + known):
        get_compressor("zzzz", D)
    with pytest.raises(ValueError, match=r"^topk takes options \['k', 'varint'\]; unknown: \['s'\], missing: \['k'\]$"):
        get_compressor("topk", D, s=3)
    with pytest.raises(
        ValueError, match=r"^qsgd takes options \['bucket_size', 's'\]; unknown: \[\], missing: \['s'\]$"
    ):
        get_compressor("qsgd", D, bucket_size=4)
    with pytest.raises(ValueError, match=r"^none takes options \[\]; unknown: \['a', 'b'\], missing: \[\]$"):
        get_compressor("none", D, b=1, a=2)
    assert get_compressor("qsgd", D, s=4).d == D  # bucket_size has a default: not missing
