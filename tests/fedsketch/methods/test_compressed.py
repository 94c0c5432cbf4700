"""The baselines' uploads as clients make them: bytes, error feedback, seeds, memory estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsketch.compress import payload_nbytes
from fedsketch.compress.signsgd import majority_vote
from fedsketch.compress.sparse import decode_support, encode_support
from fedsketch.config import ConfigError, RunConfig, check_against_model
from fedsketch.methods import compressed, get_method
from fedsketch.validate import client_state_bytes
from tests.method_helpers import PARTS, encode

D = 1000
KEYS = {"qsgd_levels": "qsgd-levels", "bucket_size": "quantizer-bucket-size", "signsgd_variant": "signsgd-variant"}


def vector(seed: int = 0, d: int = D) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def client(strategy: str, **method: object) -> RunConfig:
    settings = {KEYS.get(key, key): value for key, value in {"k": 10, **method}.items()}
    return RunConfig.from_mapping({"strategy": strategy, "seed": 7, **settings})


def state_bytes(strategy: str, d: int, clients: int, **settings: object) -> int:
    cfg = RunConfig.from_mapping({"strategy": strategy, "num-clients": clients, "clients-per-round": 1, **settings})
    return client_state_bytes(cfg, d)


@pytest.mark.parametrize(
    ("strategy", "options", "nbytes"),
    [
        ("fedavg", {}, 4 * D),
        ("true_topk", {}, 4 * D),
        ("local_topk", {}, 1 + 4 * 10 + 4 * 10),  # enc, int32 indices (k <= d/32), float32 values
        ("local_topk", {"k": 100}, 1 + D // 8 + 4 * 100),  # k > d/32: a bitmap is smaller
        ("random_k", {}, 4 * 10),  # values only: the round's seed gives the positions
        ("qsgd", {"qsgd_levels": 15, "bucket_size": 512}, 2 * 4 + D // 8 + D * 4 // 8),  # norms, signs, 4-bit levels
        ("qsgd", {"qsgd_levels": 1, "bucket_size": 0}, 4 + D // 8 + D // 8),
        ("terngrad", {"bucket_size": 0}, 4 + D * 2 // 8),
        ("signsgd", {"bucket_size": 512}, 2 * 4 + D // 8),
        ("signsgd", {"signsgd_variant": "majority"}, 4 + D // 8),  # one bit a coordinate, one unused scale
    ],
)
def test_one_payload_has_the_exact_byte_count(strategy: str, options: dict[str, object], nbytes: int) -> None:
    payload, _ = encode(client(strategy, **options), vector(), cid=3)
    assert payload_nbytes(payload) == nbytes


def test_gaussiank_lands_near_k_and_never_above_it() -> None:
    opts = client("gaussiank", k=50)
    payload, _ = encode(opts, vector(d=20_000), cid=0)
    assert 50 * 2 / 3 <= payload["val"].size <= 50


@pytest.mark.parametrize(
    ("strategy", "options"),
    [("local_topk", {}), ("random_k", {}), ("gaussiank", {}), ("signsgd", {"bucket_size": 100})],
)
def test_client_error_feedback_conserves_mass(strategy: str, options: dict[str, object]) -> None:
    """Decoded uploads plus the error a client keeps add up to its updates, whatever the rounds."""
    opts = client(strategy, **options)
    state: dict[str, torch.Tensor] = {}
    sent, total = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    for rnd in range(1, 8):
        update = vector(rnd)
        payload, state = encode(opts, update, cid=5, server_round=rnd, state=state)
        upload = PARTS[strategy].upload(opts, D)
        sent += upload.compressor.decompress(payload, seed=upload.seed(opts.seed, rnd)).double()
        total += update.double()
    assert set(state) == {"error"}
    torch.testing.assert_close(sent + state["error"].double(), total, rtol=0, atol=1e-4)


@pytest.mark.parametrize("strategy", ["qsgd", "terngrad"])
def test_unbiased_quantizers_average_to_the_update_over_clients_and_rounds(strategy: str) -> None:
    """Every (round, client) draws its own rounding noise, so their mean is unbiased; no state is kept."""
    opts, x = client(strategy, qsgd_levels=2, bucket_size=0), vector(d=40)
    upload = PARTS[strategy].upload(opts, 40)
    total, n = torch.zeros(40, dtype=torch.float64), 0
    for rnd in range(1, 41):
        for cid in range(50):
            payload, state = encode(opts, x, cid=cid, server_round=rnd)
            assert state == {}
            total += upload.compressor.decompress(payload).double()
            n += 1
    # One sample's std is at most max|x| (qsgd: norm/s); 5 sigma over 2000 samples.
    bound = 5 * max(float(x.norm()) / 2, float(x.abs().max())) / math.sqrt(n)
    assert float((total / n - x.double()).abs().max()) < bound


def test_random_k_clients_of_a_round_share_coordinates_and_rounds_differ() -> None:
    opts = client("random_k", k=20)
    supports = {}
    for rnd, cid in [(1, 0), (1, 1), (2, 0)]:
        payload, _ = encode(opts, torch.arange(1.0, D + 1), cid=cid, server_round=rnd)
        supports[rnd, cid] = set(payload["val"].astype(int).tolist())  # values are the positions + 1 here
    assert supports[1, 0] == supports[1, 1] != supports[2, 0]


def test_majority_voters_break_zeros_at_random_and_reproducibly() -> None:
    """A zero gradient must not vote '+' every round (its coordinate would drift)."""
    opts = client("signsgd", signsgd_variant="majority")
    upload = compressed.SIGNSGD.upload(opts, D)
    x = vector()
    x[::2] = 0.0  # half the coordinates have no gradient
    first, _ = encode(opts, x, cid=1)
    again, _ = encode(opts, x, cid=1)
    other, _ = encode(opts, x, cid=2)
    assert np.array_equal(first["sign"], again["sign"]) and not np.array_equal(first["sign"], other["sign"])
    signs = torch.sign(upload.compressor.decompress(first))
    assert torch.equal(signs[1::2], torch.sign(x[1::2]))
    assert 200 < int((signs[::2] < 0).sum()) < 300


def test_majority_vote_counts_one_vote_per_worker_whatever_its_scale() -> None:
    votes = [
        torch.tensor([100.0, -1.0, 1.0, 0.0]),
        torch.tensor([-1.0, -1.0, -1.0, 0.0]),
        torch.tensor([-2.0, 5.0, 0.0, 0.0]),
    ]
    torch.testing.assert_close(majority_vote(votes), torch.tensor([-1.0, -1.0, 0.0, 0.0]))


@pytest.mark.parametrize(("k", "varint", "key"), [(5, False, "idx"), (400, False, "mask"), (5, True, "gaps")])
def test_supports_round_trip_in_the_smallest_encoding(k: int, varint: bool, key: str) -> None:
    idx = torch.randperm(D, generator=torch.Generator().manual_seed(k))[:k]
    payload = encode_support(idx, D, varint=varint)
    assert set(payload) == {"enc", key}
    torch.testing.assert_close(decode_support(payload, D), torch.sort(idx).values)


def test_client_state_estimate_and_refusal_before_training() -> None:
    """Local top-k, 10,000 clients at d = 10^6: 40 GB committed, and as much again pending."""
    assert state_bytes("local_topk", 10**6, 10_000, momentum=0.9) == 80 * 10**9
    assert state_bytes("sketched_sgd", 10**6, 10_000, momentum=0.9) == 160 * 10**9
    assert state_bytes("sketched_sgd", 10**6, 10_000, momentum=0.0) == 80 * 10**9
    assert state_bytes("signsgd", 10**6, 10_000, momentum=0.9, **{"signsgd-variant": "majority"}) == 0
    for stateless in ("fedavg", "true_topk", "qsgd", "terngrad", "fetchsgd"):
        assert state_bytes(stateless, 10**6, 10_000, momentum=0.9) == 0
    cfg = RunConfig(strategy="local_topk", num_clients=10_000, clients_per_round=10, k=100)
    with pytest.raises(
        ConfigError,
        match=r"committed and pending: 10,000 clients x 7.6 MiB = 74.51 GiB .* 'max-client-state-mb' \(4096\)",
    ):
        check_against_model(cfg, d=10**6)
    check_against_model(RunConfig(strategy="fetchsgd", num_clients=10_000, clients_per_round=10, k=100), d=10**6)


def test_sketched_sgd_candidates_must_fit_the_model() -> None:
    cfg = RunConfig.from_mapping(
        {"strategy": "sketched_sgd", "k": 400, "candidate-factor": 3, "num-clients": 10, "clients-per-round": 2}
    )
    with pytest.raises(ConfigError, match=r"'candidate-factor' x 'k' \(3 x 400\) exceeds the model's 1000"):
        check_against_model(cfg, d=1000)


def test_unknown_or_sketch_strategies_have_no_compressed_upload() -> None:
    for name in ("fetchsgd", "sketched_sgd"):
        assert name not in {m.name for m in compressed.METHODS}
    with pytest.raises(ConfigError, match="unknown strategy 'nope'"):
        get_method("nope")
