"""Every registered compressor: wire-safe payloads, checked options, seeds, no Flower."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import numpy as np
import pytest
import torch

import fedsketch.compress as compress_pkg
from fedsketch.compress import COMPRESSORS, derive_seed, get_compressor, payload_nbytes

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
