"""The compressed-upload methods' own parts, exactly: seeds, error feedback, the server's mean or vote, the tally.

Each test states a property of :mod:`fedsketch.methods.compressed` (local top-k,
random-k, Gaussian-k, QSGD, TernGrad, signSGD; Stich et al., NeurIPS 2018;
Alistarh et al., NeurIPS 2017; Karimireddy et al., ICML 2019; Bernstein et al.,
ICLR 2019), with float64 references computed here and settings away from their
defaults (docs/mutation.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.method_helpers import PARTS

from fedsketch.algorithms import topk_sgd
from fedsketch.compress import derive_seed, registry, signsgd
from fedsketch.compress.topk import decompress as topk_decompress
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, Round, compressed
from fedsketch.methods.method import Client, Docs, Method, Server, Wire, no_requests, no_round_config

D = 8
CPU = torch.device("cpu")
# distinct dyadic magnitudes: sums of two are exact in float32, and no two coordinates tie
UPDATE = torch.tensor([0.5, -2.0, 0.25, 4.0, -1.0, 0.125, -8.0, 1.5])
ERROR = torch.tensor([0.0625, 16.0, -0.03125, 0.0, 0.375, -32.0, 0.0, 0.0])


def _cfg(strategy: str, **settings: object) -> RunConfig:
    return RunConfig.from_mapping({"strategy": strategy, "seed": 7, "k": 2, **settings})


# --- seeds ----------------------------------------------------------------------------------------------


def test_an_uploads_seed_is_the_rounds_the_clients_or_none() -> None:
    comp = registry.topk_compressor(D, 2)
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
    up = compressed._signsgd(cfg, D, True)
    assert (up.error_feedback, up.seed_scope, up.vote) == (True, "none", False)
    assert (up.compressor.name, up.compressor.d) == ("signsgd", D)
    payload = up.compressor.compress(UPDATE)
    # two buckets of four: mean magnitudes 6.75 / 4 and 10.625 / 4
    assert payload["scale"].tolist() == [6.75 / 4, 10.625 / 4]
    assert np.array_equal(payload["sign"], signsgd.compress(UPDATE, bucket_size=4)["sign"])
    one = compressed._signsgd(_cfg("signsgd", **{"quantizer-bucket-size": 0}), D, True)
    assert one.compressor.compress(UPDATE)["scale"].tolist() == [17.375 / 8]


def test_majority_signsgd_sends_sign_bits_with_a_fair_coin_for_zeros_and_votes() -> None:
    cfg = _cfg("signsgd", **{"quantizer-bucket-size": 4, "signsgd-variant": "majority"})
    up = compressed._signsgd(cfg, D, False)
    assert (up.error_feedback, up.seed_scope, up.vote) == (False, "client", True)
    zeros = torch.zeros(64)
    voter = compressed._signsgd(cfg, 64, False).compressor
    for seed in (1, 2):  # one scale for the whole vector; every zero a coin from the client's seed
        sent = voter.compress(zeros, seed=seed)
        assert np.array_equal(sent["sign"], signsgd.compress(zeros, zero_seed=seed)["sign"])
        assert sent["scale"].tolist() == [0.0] and 0 < int(np.unpackbits(sent["sign"]).sum()) < 64
    with pytest.raises(ValueError, match="needs a seed"):
        voter.compress(zeros)
    assert compressed._signsgd(cfg, D, False).compressor.compress(UPDATE, seed=3)["scale"].size == 1


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
    assert PARTS[strategy].upload(cfg, D).error_feedback is bool(vectors)


# --- the client's upload ---------------------------------------------------------------------------------


def test_local_topk_sends_the_top_k_of_update_plus_error_and_keeps_the_rest() -> None:
    cfg = _cfg("local_topk")
    payload, kept = compressed.LOCAL_TOPK.encode(UPDATE, ClientJob(5, 3, {}, {"error": ERROR}), cfg)
    target = UPDATE + ERROR  # exact: dyadic
    sent = torch.zeros(D)
    sent[[5, 1]] = target[[5, 1]]  # -31.875 and 14.0
    assert torch.equal(topk_decompress(payload, D), sent)
    assert set(kept) == {"error"} and torch.equal(kept["error"], target - sent)
    first, kept = compressed.LOCAL_TOPK.encode(UPDATE, ClientJob(5, 1), cfg)  # no error yet
    assert torch.equal(topk_decompress(first, D)[[3, 6]], UPDATE[[3, 6]]) and set(kept) == {"error"}


def test_stateless_local_topk_ignores_any_error_and_keeps_nothing() -> None:
    cfg = _cfg("local_topk", **{"local-topk-error": "none"})
    payload, kept = compressed.LOCAL_TOPK.encode(UPDATE, ClientJob(5, 3, {}, {"error": ERROR}), cfg)
    assert kept == {} and topk_decompress(payload, D).nonzero().flatten().tolist() == [3, 6]


def test_random_k_sends_the_rounds_coordinates_of_update_plus_error() -> None:
    cfg = _cfg("random_k", k=3)
    comp = registry.random_k_compressor(D, 3)
    payload, kept = compressed.RANDOM_K.encode(UPDATE, ClientJob(5, 3, {}, {"error": ERROR}), cfg)
    target = UPDATE + ERROR
    expected = comp.compress(target, seed=derive_seed(7, 3))
    assert set(payload) == set(expected) and all(np.array_equal(payload[k], expected[k]) for k in expected)
    sent = comp.decompress(payload, seed=derive_seed(7, 3))
    assert torch.equal(kept["error"], target - sent) and int((sent != 0).sum()) == 3
    # the server decodes with the round's seed: the layout of round 3, not of round 4
    assert torch.equal(compressed.RANDOM_K.layout(cfg, D, 3)(payload), sent)  # type: ignore[arg-type]
    other = compressed.RANDOM_K.layout(cfg, D, 4)(payload)
    assert not torch.equal(other, sent)  # type: ignore[arg-type]


def test_qsgd_rounds_with_the_clients_own_seed_and_keeps_nothing() -> None:
    cfg = _cfg("qsgd", **{"qsgd-levels": 3, "quantizer-bucket-size": 4})
    comp = registry.qsgd_compressor(D, s=3, bucket_size=4)
    payloads = {}
    for cid, rnd in ((5, 3), (6, 3), (5, 4)):
        payloads[cid, rnd], kept = compressed.QSGD.encode(UPDATE, ClientJob(cid, rnd, {}, {"error": ERROR}), cfg)
        expected = comp.compress(UPDATE, seed=derive_seed(7, rnd, cid))
        assert kept == {} and all(np.array_equal(payloads[cid, rnd][k], v) for k, v in expected.items())
        decoded = compressed.QSGD.layout(cfg, D, rnd)(payloads[cid, rnd])
        assert torch.equal(decoded, comp.decompress(expected))  # type: ignore[arg-type]


# --- the server ------------------------------------------------------------------------------------------


def test_the_server_parameters_and_state_follow_the_run() -> None:
    cfg = _cfg("local_topk", momentum=0.5, **{"momentum-zeroing": False, "download-k": 3})
    assert compressed._params(cfg, D) == topk_sgd.TopkServerParams(D, 3, 0.5, False)
    assert compressed._params(_cfg("local_topk"), D) == topk_sgd.TopkServerParams(D, None, 0.9, True)
    state = compressed.init(cfg, D, torch.device("meta"))
    assert state.server.momentum.device.type == state.server.error.device.type == "meta"
    assert state.server.momentum.shape == (D,) and state.server.momentum.dtype == torch.float32
    assert state.tally.dtype == torch.float64 and torch.equal(state.tally, torch.zeros(2, dtype=torch.float64))


def _topk_reference(gs: list[torch.Tensor], lr: float, rho: float, k: int, zeroing: bool) -> list[torch.Tensor]:
    u, e, out = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64), []
    for g in gs:
        u = rho * u + g
        e = e + lr * u
        top = torch.topk(e.abs(), k).indices
        delta = torch.zeros(D, dtype=torch.float64)
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
        payload, _ = parts.encode(torch.randn(D, generator=gen), ClientJob(cid, rnd), cfg)
        updates.append(ClientUpdate(cid, payload, n, 0.0, 0, decoded=parts.layout(cfg, D, rnd)(payload)))
    return Round(rnd, lr, updates, D, CPU)


def _mean64(rnd: Round) -> torch.Tensor:
    decoded = [u.decoded for u in rnd.updates if isinstance(u.decoded, torch.Tensor)]
    weights = [u.num_examples for u in rnd.updates]
    return torch.stack([x.double() * w for x, w in zip(decoded, weights, strict=True)]).sum(0) / sum(weights)


def test_two_rounds_of_local_topk_are_momentum_sgd_with_download_k_on_the_weighted_mean() -> None:
    cfg = _cfg("local_topk", momentum=0.5, **{"momentum-zeroing": False, "download-k": 3})
    state = compressed.init(cfg, D, CPU)
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
    state = compressed.init(cfg, D, CPU)
    for r in (1, 2):
        rnd = _round(cfg, compressed.GAUSSIANK, r, 0.5, (2, 5))
        g = _mean64(rnd)
        velocity = 0.25 * state.server.momentum.double() + g
        state, delta = compressed.GAUSSIANK.step(state, rnd, cfg)
        torch.testing.assert_close(delta.double(), 0.5 * velocity, rtol=1e-6, atol=1e-7)
    zeroing = _cfg("gaussiank", k=3, momentum=0.25, **{"download-k": 2})
    state = compressed.init(zeroing, D, CPU)
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
        updates.append(ClientUpdate(cid, payload, n, 0.0, 0, decoded=parts.layout(cfg, D, 1)(payload)))
    state, delta = parts.step(compressed.init(cfg, D, CPU), Round(1, 0.5, updates, D, CPU), cfg)
    vote = torch.sign(torch.sign(big) + 2 * torch.sign(small))  # one vote a client, whatever its examples
    assert torch.equal(delta, 0.5 * vote)
    assert torch.equal(state.tally, torch.zeros(2, dtype=torch.float64))  # not a sparsifier: nothing tallied


def test_the_tally_counts_every_value_sent_exactly_in_float64() -> None:
    """2**24 + 1 values in one round (a view, no memory): float32 would round the count to 2**24."""
    cfg = _cfg("random_k", k=3, momentum=0.0)
    rnd = _round(cfg, compressed.RANDOM_K, 1, 1.0, (1,))
    huge = np.broadcast_to(np.float32(0.0), (2**24 + 1,))
    updates = [ClientUpdate(0, {"val": huge}, 1, 0.0, 0, decoded=rnd.updates[0].decoded)]
    state, _ = compressed.RANDOM_K.step(compressed.init(cfg, D, CPU), Round(1, 1.0, updates, D, CPU), cfg)
    assert state.tally.tolist() == [2.0**24 + 1, 1.0]


def test_a_report_is_the_mean_per_client_and_its_ratio_to_k_then_resets() -> None:
    cfg = _cfg("local_topk", k=5)
    base = compressed.init(cfg, D, CPU)
    state = compressed.CompressedState(base.server, torch.tensor([10.0, 4.0], dtype=torch.float64))
    after, row = compressed.report(state, cfg)
    assert row == {"values_per_client": 2.5, "values_over_k": 0.5}
    assert after.server is base.server and after.tally.dtype == torch.float64 and after.tally.tolist() == [0.0, 0.0]
    again, empty = compressed.report(after, cfg)
    assert again is after and empty == {}


def test_a_record_binds_its_parts_and_the_shared_server() -> None:
    parts = compressed.QSGD
    made = compressed._method("xq", parts, "up", "keeps", "paper", uses=("k",), sweep={"k": "k"})
    assert made == Method(
        name="xq",
        docs=Docs("up", "keeps", "paper"),
        client=Client(parts.encode, state_vectors=parts.state_vectors),
        server=Server(compressed.init, parts.step, report=compressed.report),
        wire=Wire(parts.layout),
        uses=("k",),
        sweep={"k": "k"},
    )
    assert made.client.answer is None and made.server.ask is None and made.server.requests is no_requests
    assert made.wire.round_config is no_round_config and made.client.commit == "upload"
    for m in compressed.METHODS:
        assert m.client.encode == PARTS[m.name].encode and m.wire.layout == PARTS[m.name].layout
        assert m.server.init is compressed.init and m.server.report is compressed.report
