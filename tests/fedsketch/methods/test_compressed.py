"""The compressed-upload methods: the uploads as clients make them, then their own parts exactly.

First bytes, error feedback, seeds and the memory estimate; then each part of
:mod:`fedsketch.methods.compressed` (local top-k, random-k, Gaussian-k, QSGD,
TernGrad, signSGD; Stich et al., NeurIPS 2018; Alistarh et al., NeurIPS 2017;
Karimireddy et al., ICML 2019; Bernstein et al., ICLR 2019): seeds, error
feedback, the server's mean or vote, the tally, with float64 references
computed here and settings away from their defaults (docs/mutation.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsketch.algorithms import topk_sgd
from fedsketch.compress import derive_seed, payload_nbytes, registry, signsgd
from fedsketch.compress.signsgd import majority_vote
from fedsketch.compress.sparse import decode_support, encode_support
from fedsketch.compress.topk import decompress as topk_decompress
from fedsketch.config import ConfigError, RunConfig
from fedsketch.fit import check_against_model, client_state_bytes
from fedsketch.methods import ClientJob, ClientUpdate, Round, compressed, get_method
from fedsketch.methods.method import Client, Method, Server, Wire, no_requests, no_round_config
from fedsketch.settings.declared import DECLARATIONS
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


# the methods' own parts, exactly: seeds, error feedback, the server's mean or vote, the tally ---------------


D_SMALL = 8
CPU = torch.device("cpu")
# distinct dyadic magnitudes: sums of two are exact in float32, and no two coordinates tie
UPDATE = torch.tensor([0.5, -2.0, 0.25, 4.0, -1.0, 0.125, -8.0, 1.5])
ERROR = torch.tensor([0.0625, 16.0, -0.03125, 0.0, 0.375, -32.0, 0.0, 0.0])


def _cfg(strategy: str, **settings: object) -> RunConfig:
    return RunConfig.from_mapping({"strategy": strategy, "seed": 7, "k": 2, **settings})


# --- seeds ----------------------------------------------------------------------------------------------


def test_an_uploads_seed_is_the_rounds_the_clients_or_none() -> None:
    comp = registry.topk_compressor(D_SMALL, 2)
    shared = compressed.Upload(comp, False, "round")
    assert shared.seed(7, 3, 5) == shared.seed(7, 3) == derive_seed(7, 3) != derive_seed(7, 4)
    private = compressed.Upload(comp, False, "client")
    assert private.seed(7, 3, 5) == derive_seed(7, 3, 5) and private.seed(7, 3, 0) == derive_seed(7, 3, 0)
    assert private.seed(7, 3) is None  # the server never needs a client's private seed
    plain = compressed.Upload(comp, True)
    assert plain.seed(7, 3, 5) is None and plain.seed_scope == "none" and plain.vote is False


# --- what each record uploads -----------------------------------------------------------------------------


def test_the_bucket_size_zero_is_one_scale() -> None:
    assert compressed._bucket(_cfg("qsgd", **{"quantizer-bucket-size": 0})) is None
    assert compressed._bucket(_cfg("qsgd", **{"quantizer-bucket-size": 4})) == 4
    assert compressed._always(_cfg("qsgd")) is True and compressed._never(_cfg("qsgd")) is False


def test_ef_signsgd_sends_one_scale_a_bucket_and_keeps_its_error() -> None:
    cfg = _cfg("signsgd", **{"quantizer-bucket-size": 4})
    up = compressed._signsgd(cfg, D_SMALL, True)
    assert (up.error_feedback, up.seed_scope, up.vote) == (True, "none", False)
    assert (up.compressor.name, up.compressor.d) == ("signsgd", D_SMALL)
    payload = up.compressor.compress(UPDATE)
    # two buckets of four: mean magnitudes 6.75 / 4 and 10.625 / 4
    assert payload["scale"].tolist() == [6.75 / 4, 10.625 / 4]
    assert np.array_equal(payload["sign"], signsgd.compress(UPDATE, bucket_size=4)["sign"])
    one = compressed._signsgd(_cfg("signsgd", **{"quantizer-bucket-size": 0}), D_SMALL, True)
    assert one.compressor.compress(UPDATE)["scale"].tolist() == [17.375 / 8]


def test_majority_signsgd_sends_sign_bits_with_a_fair_coin_for_zeros_and_votes() -> None:
    cfg = _cfg("signsgd", **{"quantizer-bucket-size": 4, "signsgd-variant": "majority"})
    up = compressed._signsgd(cfg, D_SMALL, False)
    assert (up.error_feedback, up.seed_scope, up.vote) == (False, "client", True)
    zeros = torch.zeros(64)
    voter = compressed._signsgd(cfg, 64, False).compressor
    for seed in (1, 2):  # one scale for the whole vector; every zero a coin from the client's seed
        sent = voter.compress(zeros, seed=seed)
        assert np.array_equal(sent["sign"], signsgd.compress(zeros, zero_seed=seed)["sign"])
        assert sent["scale"].tolist() == [0.0] and 0 < int(np.unpackbits(sent["sign"]).sum()) < 64
    with pytest.raises(ValueError, match="needs a seed"):
        voter.compress(zeros)
    assert compressed._signsgd(cfg, D_SMALL, False).compressor.compress(UPDATE, seed=3)["scale"].size == 1


@pytest.mark.parametrize(
    ("strategy", "settings", "vectors"),
    [
        ("local_topk", {}, 1),
        ("local_topk", {"local-topk-error": "none"}, 0),
        ("random_k", {}, 1),
        ("gaussiank", {}, 1),
        ("qsgd", {}, 0),
        ("terngrad", {}, 0),
        ("signsgd", {}, 1),
        ("signsgd", {"signsgd-variant": "majority"}, 0),
    ],
)
def test_error_feedback_is_one_client_vector_where_the_method_keeps_it(
    strategy: str, settings: dict[str, object], vectors: int
) -> None:
    cfg = _cfg(strategy, **settings)
    assert PARTS[strategy].state_vectors(cfg) == vectors
    assert PARTS[strategy].upload(cfg, D_SMALL).error_feedback is bool(vectors)


# --- the client's upload ---------------------------------------------------------------------------------


def test_local_topk_sends_the_top_k_of_update_plus_error_and_keeps_the_rest() -> None:
    cfg = _cfg("local_topk")
    payload, kept = compressed.LOCAL_TOPK.encode(UPDATE, ClientJob(5, 3, {}, {"error": ERROR}), cfg)
    target = UPDATE + ERROR  # exact: dyadic
    sent = torch.zeros(D_SMALL)
    sent[[5, 1]] = target[[5, 1]]  # -31.875 and 14.0
    assert torch.equal(topk_decompress(payload, D_SMALL), sent)
    assert set(kept) == {"error"} and torch.equal(kept["error"], target - sent)
    first, kept = compressed.LOCAL_TOPK.encode(UPDATE, ClientJob(5, 1), cfg)  # no error yet
    assert torch.equal(topk_decompress(first, D_SMALL)[[3, 6]], UPDATE[[3, 6]]) and set(kept) == {"error"}


def test_stateless_local_topk_ignores_any_error_and_keeps_nothing() -> None:
    cfg = _cfg("local_topk", **{"local-topk-error": "none"})
    payload, kept = compressed.LOCAL_TOPK.encode(UPDATE, ClientJob(5, 3, {}, {"error": ERROR}), cfg)
    assert kept == {} and topk_decompress(payload, D_SMALL).nonzero().flatten().tolist() == [3, 6]


def test_random_k_sends_the_rounds_coordinates_of_update_plus_error() -> None:
    cfg = _cfg("random_k", k=3)
    comp = registry.random_k_compressor(D_SMALL, 3)
    payload, kept = compressed.RANDOM_K.encode(UPDATE, ClientJob(5, 3, {}, {"error": ERROR}), cfg)
    target = UPDATE + ERROR
    expected = comp.compress(target, seed=derive_seed(7, 3))
    assert set(payload) == set(expected) and all(np.array_equal(payload[k], expected[k]) for k in expected)
    sent = comp.decompress(payload, seed=derive_seed(7, 3))
    assert torch.equal(kept["error"], target - sent) and int((sent != 0).sum()) == 3
    # the server decodes with the round's seed: the layout of round 3, not of round 4
    assert torch.equal(compressed.RANDOM_K.layout(cfg, D_SMALL, 3)(payload), sent)  # type: ignore[arg-type]
    other = compressed.RANDOM_K.layout(cfg, D_SMALL, 4)(payload)
    assert not torch.equal(other, sent)  # type: ignore[arg-type]


def test_qsgd_rounds_with_the_clients_own_seed_and_keeps_nothing() -> None:
    cfg = _cfg("qsgd", **{"qsgd-levels": 3, "quantizer-bucket-size": 4})
    comp = registry.qsgd_compressor(D_SMALL, s=3, bucket_size=4)
    payloads = {}
    for cid, rnd in ((5, 3), (6, 3), (5, 4)):
        payloads[cid, rnd], kept = compressed.QSGD.encode(UPDATE, ClientJob(cid, rnd, {}, {"error": ERROR}), cfg)
        expected = comp.compress(UPDATE, seed=derive_seed(7, rnd, cid))
        assert kept == {} and all(np.array_equal(payloads[cid, rnd][k], v) for k, v in expected.items())
        decoded = compressed.QSGD.layout(cfg, D_SMALL, rnd)(payloads[cid, rnd])
        assert torch.equal(decoded, comp.decompress(expected))  # type: ignore[arg-type]


# --- the server ------------------------------------------------------------------------------------------


def test_the_server_parameters_and_state_follow_the_run() -> None:
    cfg = _cfg("local_topk", momentum=0.5, **{"momentum-zeroing": False, "download-k": 3})
    assert compressed._params(cfg, D_SMALL) == topk_sgd.TopkServerParams(D_SMALL, 3, 0.5, False)
    assert compressed._params(_cfg("local_topk"), D_SMALL) == topk_sgd.TopkServerParams(D_SMALL, None, 0.9, True)
    state = compressed.init(cfg, D_SMALL, torch.device("meta"))
    assert state.server.momentum.device.type == state.server.error.device.type == "meta"
    assert state.server.momentum.shape == (D_SMALL,) and state.server.momentum.dtype == torch.float32
    assert state.tally.dtype == torch.float64 and torch.equal(state.tally, torch.zeros(2, dtype=torch.float64))


def _topk_reference(gs: list[torch.Tensor], lr: float, rho: float, k: int, zeroing: bool) -> list[torch.Tensor]:
    u, e, out = torch.zeros(D_SMALL, dtype=torch.float64), torch.zeros(D_SMALL, dtype=torch.float64), []
    for g in gs:
        u = rho * u + g
        e = e + lr * u
        top = torch.topk(e.abs(), k).indices
        delta = torch.zeros(D_SMALL, dtype=torch.float64)
        delta[top] = e[top]
        e[top] = 0.0
        if zeroing:
            u[top] = 0.0
        out.append(delta)
    return out


def _round(cfg: RunConfig, parts: compressed.Compressed, rnd: int, lr: float, examples: tuple[int, ...]) -> Round:
    gen = torch.Generator().manual_seed(rnd)
    updates = []
    for cid, n in enumerate(examples):
        payload, _ = parts.encode(torch.randn(D_SMALL, generator=gen), ClientJob(cid, rnd), cfg)
        updates.append(ClientUpdate(cid, payload, n, 0.0, 0, decoded=parts.layout(cfg, D_SMALL, rnd)(payload)))
    return Round(rnd, lr, updates, D_SMALL, CPU)


def _mean64(rnd: Round) -> torch.Tensor:
    decoded = [u.decoded for u in rnd.updates if isinstance(u.decoded, torch.Tensor)]
    weights = [u.num_examples for u in rnd.updates]
    return torch.stack([x.double() * w for x, w in zip(decoded, weights, strict=True)]).sum(0) / sum(weights)


def test_two_rounds_of_local_topk_are_momentum_sgd_with_download_k_on_the_weighted_mean() -> None:
    cfg = _cfg("local_topk", momentum=0.5, **{"momentum-zeroing": False, "download-k": 3})
    state = compressed.init(cfg, D_SMALL, CPU)
    rounds = [_round(cfg, compressed.LOCAL_TOPK, r, 0.25, (1, 3, 6)) for r in (1, 2)]
    expected = _topk_reference([_mean64(r) for r in rounds], 0.25, 0.5, 3, False)
    tallies = []
    for rnd, want in zip(rounds, expected, strict=True):
        state, delta = compressed.LOCAL_TOPK.step(state, rnd, cfg)
        torch.testing.assert_close(delta.double(), want, rtol=1e-6, atol=1e-7)
        tallies.append(state.tally)
    assert (
        tallies[0].dtype == torch.float64 and tallies[0].tolist() == [6.0, 3.0] and tallies[1].tolist() == [12.0, 6.0]
    )
    state, row = compressed.report(state, cfg)
    assert row == {"values_per_client": 2.0, "values_over_k": 1.0}


def test_zeroing_and_no_download_k_follow_the_run() -> None:
    cfg = _cfg("gaussiank", k=3, momentum=0.25)
    state = compressed.init(cfg, D_SMALL, CPU)
    for r in (1, 2):
        rnd = _round(cfg, compressed.GAUSSIANK, r, 0.5, (2, 5))
        g = _mean64(rnd)
        velocity = 0.25 * state.server.momentum.double() + g
        state, delta = compressed.GAUSSIANK.step(state, rnd, cfg)
        torch.testing.assert_close(delta.double(), 0.5 * velocity, rtol=1e-6, atol=1e-7)
    zeroing = _cfg("gaussiank", k=3, momentum=0.25, **{"download-k": 2})
    state = compressed.init(zeroing, D_SMALL, CPU)
    rounds = [_round(zeroing, compressed.GAUSSIANK, r, 0.5, (2, 5)) for r in (1, 2, 3)]
    expected = _topk_reference([_mean64(r) for r in rounds], 0.5, 0.25, 2, True)
    for rnd, want in zip(rounds, expected, strict=True):
        state, delta = compressed.GAUSSIANK.step(state, rnd, zeroing)
        torch.testing.assert_close(delta.double(), want, rtol=1e-6, atol=1e-7)


def test_majority_signsgd_applies_the_vote_not_the_weighted_mean() -> None:
    cfg = _cfg("signsgd", momentum=0.0, **{"signsgd-variant": "majority"})
    parts = compressed.SIGNSGD
    big = torch.tensor([9.0, 9.0, -9.0, 9.0, -9.0, 9.0, 9.0, -9.0])
    small = torch.tensor([-1.0, -1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
    updates = []
    for cid, (vec, n) in enumerate(((big, 10), (small, 1), (small, 1))):
        payload, kept = parts.encode(vec, ClientJob(cid, 1), cfg)
        assert kept == {}
        updates.append(ClientUpdate(cid, payload, n, 0.0, 0, decoded=parts.layout(cfg, D_SMALL, 1)(payload)))
    state, delta = parts.step(compressed.init(cfg, D_SMALL, CPU), Round(1, 0.5, updates, D_SMALL, CPU), cfg)
    vote = torch.sign(torch.sign(big) + 2 * torch.sign(small))  # one vote a client, whatever its examples
    assert torch.equal(delta, 0.5 * vote)
    assert torch.equal(state.tally, torch.zeros(2, dtype=torch.float64))  # not a sparsifier: nothing tallied


def test_the_tally_counts_every_value_sent_exactly_in_float64() -> None:
    """2**24 + 1 values in one round (a view, no memory): float32 would round the count to 2**24."""
    cfg = _cfg("random_k", k=3, momentum=0.0)
    rnd = _round(cfg, compressed.RANDOM_K, 1, 1.0, (1,))
    huge = np.broadcast_to(np.float32(0.0), (2**24 + 1,))
    updates = [ClientUpdate(0, {"val": huge}, 1, 0.0, 0, decoded=rnd.updates[0].decoded)]
    state, _ = compressed.RANDOM_K.step(compressed.init(cfg, D_SMALL, CPU), Round(1, 1.0, updates, D_SMALL, CPU), cfg)
    assert state.tally.tolist() == [2.0**24 + 1, 1.0]


def test_a_report_is_the_mean_per_client_and_its_ratio_to_k_then_resets() -> None:
    cfg = _cfg("local_topk", k=5)
    base = compressed.init(cfg, D_SMALL, CPU)
    state = compressed.CompressedState(base.server, torch.tensor([10.0, 4.0], dtype=torch.float64))
    after, row = compressed.report(state, cfg)
    assert row == {"values_per_client": 2.5, "values_over_k": 0.5}
    assert after.server is base.server and after.tally.dtype == torch.float64 and after.tally.tolist() == [0.0, 0.0]
    again, empty = compressed.report(after, cfg)
    assert again is after and empty == {}


def test_a_record_binds_its_parts_and_the_shared_server() -> None:
    parts = compressed.QSGD
    made = compressed._method("qsgd", parts)
    assert made == Method(
        DECLARATIONS["qsgd"],
        client=Client(parts.encode, state_vectors=parts.state_vectors),
        server=Server(compressed.init, parts.step, report=compressed.report),
        wire=Wire(parts.layout),
    )
    assert made.client.answer is None and made.server.ask is None and made.server.requests is no_requests
    assert made.wire.round_config is no_round_config and made.client.commit == "upload"
    for m in compressed.METHODS:
        assert m.client.encode == PARTS[m.name].encode and m.wire.layout == PARTS[m.name].layout
        assert m.server.init is compressed.init and m.server.report is compressed.report
