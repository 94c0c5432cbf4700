"""Client-batching's encode: the tables of many Count Sketches at once equal each sketch's own.

``fedsketch.sketch.batch.sketch_tables`` hashes each block of buckets once for all the vectors
(``fedsketch.sketch.batch._accumulate_batch``); FetchSGD's ``encode_many`` uses it on a GPU and
``fedsketch.client.cohort`` calls it for each vectorized chunk, one client at a time should it fail.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedsketch import methods
from fedsketch.client.cohort import run_cohort
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.methods import ClientJob, get_method
from fedsketch.methods import fetchsgd as fetchsgd_method
from fedsketch.model.flat import get_flat
from fedsketch.sketch import batch as sketch_batch
from fedsketch.sketch.batch import host_tables, sketch_tables
from fedsketch.sketch.count_sketch import CountSketch
from fedsketch.task import make_model


def one_by_one(vecs: torch.Tensor, rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.stack([CountSketch(vecs.shape[1], rows, cols, seed).accumulate(v).table.clone() for v in vecs])


# the last case has 4,688 chunks of 64: more than one span of HASH_SPAN chunks hashed at once
@pytest.mark.parametrize(
    ("d", "rows", "cols"), [(70_001, 5, 40_000), (1_000, 3, 64), (33_000, 1, 2_048), (300_001, 2, 64)]
)
def test_the_tables_equal_each_vectors_own_sketch(d: int, rows: int, cols: int) -> None:
    vecs = torch.randn(4, d, generator=torch.Generator().manual_seed(d), dtype=torch.float64).float()
    got = sketch_tables(vecs, rows, cols, seed=7)
    want = one_by_one(vecs, rows, cols, 7)
    assert got.shape == (4, rows, cols) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


# one chunk a block, the last one padded; then 3 chunks a block (3 vectors x 2 rows x 64) over 4,688
# chunks of 64, more than one span of HASH_SPAN chunks hashed at once
@pytest.mark.parametrize(("d", "rows", "cols", "block"), [(100_003, 5, 50_000, 1), (300_001, 2, 64, 1_152)])
def test_small_blocks_and_several_hash_spans_still_cover_every_coordinate(
    monkeypatch: pytest.MonkeyPatch, d: int, rows: int, cols: int, block: int
) -> None:
    monkeypatch.setattr(sketch_batch, "BATCH_BLOCK", block)
    vecs = torch.randn(3, d, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        sketch_tables(vecs, rows, cols, 3), one_by_one(vecs, rows, cols, 3), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_vectors_of_another_float_type_give_float32_tables(dtype: torch.dtype) -> None:
    vecs = torch.randn(2, 5_000, generator=torch.Generator().manual_seed(3)).to(dtype)
    got = sketch_tables(vecs, 3, 700, 1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, one_by_one(vecs.float(), 3, 700, 1), rtol=1e-5, atol=1e-4)


def test_a_sketch_of_a_sum_is_the_sum_of_the_tables() -> None:
    vecs = torch.randn(5, 9_999, generator=torch.Generator().manual_seed(2), dtype=torch.float64).float()
    tables = sketch_tables(vecs, 4, 1_000, 11)
    whole = CountSketch(9_999, 4, 1_000, 11).accumulate(vecs.sum(0)).table
    torch.testing.assert_close(tables.sum(0), whole, rtol=1e-4, atol=1e-4)


def test_bad_vectors_are_refused_by_name() -> None:
    message = "vecs must be a 2-D floating-point tensor; got "
    for bad, got in (
        (torch.ones(10), "torch.Size([10])"),
        (torch.ones(2, 10, dtype=torch.int64), "torch.Size([2, 10])"),
        ([[1.0, 2.0]], "<class 'list'>"),
    ):
        with pytest.raises(ValueError) as err:
            sketch_tables(bad, 2, 8, 0)  # type: ignore[arg-type]  # a list, on purpose
        assert str(err.value) == message + got
    with pytest.raises(ValueError, match=r"^seed must be below 2\*\*64"):
        sketch_tables(torch.ones(2, 10), 2, 8, 2**64)
    with pytest.raises(ValueError, match="^cols must be positive"):
        sketch_tables(torch.ones(2, 10), 2, 0, 1)
    with pytest.raises(ValueError, match="^vecs contains NaN or Inf$"):
        sketch_tables(torch.tensor([[0.0, 1.0], [float("nan"), 2.0]]), 2, 8, 0)
    assert sketch_tables(torch.zeros(0, 10), 2, 8, 0).shape == (0, 2, 8)


def small_cfg(**over: object) -> RunConfig:
    base = {
        "strategy": "fetchsgd",
        "num-clients": 20,
        "clients-per-round": 6,
        "sketch-rows": 3,
        "sketch-cols": 500,
        "k": 50,
        "client-batching": 3,
        "seed": 5,
    }
    return RunConfig.from_mapping({**base, **over})


def test_encode_many_on_a_cpu_is_encode_for_each_client() -> None:
    # 3,000 columns: the CPU's windowed loops, whose sums the batched blocks match only to rounding
    cfg = small_cfg(**{"sketch-cols": 3_000})
    rc = fetchsgd_method.round_config(cfg)
    updates = [torch.randn(20_011, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    jobs = [ClientJob(i, 1, rc) for i in range(3)]
    many = get_method("fetchsgd").client.encode_many
    assert many is not None
    for (payload, state), u, job in zip(many(updates, jobs, cfg), updates, jobs, strict=True):
        alone, _ = fetchsgd_method.encode(u, job, cfg)
        assert state == {} and np.array_equal(payload["table"], alone["table"])


def test_sketched_together_each_table_is_the_clients_own() -> None:
    cfg = small_cfg(**{"sketch-rows": 4, "sketch-cols": 3_000, "seed": 9})
    rc = fetchsgd_method.round_config(cfg)
    updates = [torch.randn(20_011, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    together = fetchsgd_method.encode_together(updates, rc)
    for (payload, state), u in zip(together, updates, strict=True):
        alone, _ = fetchsgd_method.encode(u, ClientJob(0, 1, rc), cfg)
        assert state == {} and payload["table"].shape == (4, 3_000) and payload["table"].dtype == np.float32
        np.testing.assert_allclose(payload["table"], alone["table"], rtol=1e-5, atol=1e-5)
    other = fetchsgd_method.encode_together(updates, {**rc, "sketch-seed": 10})
    assert not np.allclose(other[0][0]["table"], together[0][0]["table"])


def test_a_failing_batched_encode_leaves_each_client_to_its_own(monkeypatch, caplog) -> None:
    cfg = small_cfg()
    data = load_data(cfg)
    w = get_flat(make_model(cfg, data)).numpy()
    jobs = [ClientJob(cid, 1, fetchsgd_method.round_config(cfg)) for cid in (0, 3, 4, 9, 12, 17)]
    good = run_cohort(cfg, w, jobs)
    method = get_method("fetchsgd")

    def broken(*args: object) -> list:
        raise RuntimeError("out of memory")

    broken_method = dataclasses.replace(method, client=dataclasses.replace(method.client, encode_many=broken))
    monkeypatch.setitem(methods.REGISTRY, "fetchsgd", broken_method)
    fallen = run_cohort(cfg, w, jobs)
    assert "the batched encode failed (RuntimeError: out of memory)" in caplog.text
    for a, b in zip(good, fallen, strict=True):
        assert a.cid == b.cid and a.error is None and np.array_equal(a.payload["table"], b.payload["table"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_batched_tables_equal_each_clients_own() -> None:
    cfg = small_cfg(device="cuda")
    rc = fetchsgd_method.round_config(cfg)
    updates = [torch.randn(70_001, device="cuda", generator=torch.Generator("cuda").manual_seed(i)) for i in range(4)]
    jobs = [ClientJob(i, 1, rc) for i in range(4)]
    many = get_method("fetchsgd").client.encode_many
    assert many is not None
    for (payload, _), u, job in zip(many(updates, jobs, cfg), updates, jobs, strict=True):
        alone, _ = fetchsgd_method.encode(u, job, cfg)
        np.testing.assert_allclose(payload["table"], alone["table"], rtol=1e-5, atol=1e-4)
    assert sketch_tables(torch.stack(updates), 3, 500, 5).device.type == "cuda"


def test_host_tables_are_the_tables_on_the_host() -> None:
    tables = sketch_tables(torch.randn(3, 900, generator=torch.Generator().manual_seed(2)), 3, 50, 4)
    host = host_tables(tables)
    assert host.device.type == "cpu" and torch.equal(host, tables)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_tables_come_back_in_page_locked_memory_intact() -> None:
    tables = sketch_tables(torch.randn(4, 70_001, device="cuda"), 3, 500, 5)
    host = host_tables(tables)
    assert host.is_pinned() and host.device.type == "cpu"
    assert torch.equal(host, tables.cpu())
