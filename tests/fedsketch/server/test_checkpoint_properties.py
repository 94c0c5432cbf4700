"""A checkpoint's properties, without a run: each field round-trips bit for bit, each refusal says why."""

from __future__ import annotations

import hashlib
import io
import math
import random
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsketch.config import RunConfig
from fedsketch.server import checkpoint
from fedsketch.server.books import Books
from fedsketch.server.checkpoint import CheckpointError
from fedsketch.server.ledger import DownloadLedger


@dataclass(frozen=True)
class Inner:
    error: torch.Tensor
    steps: int


@dataclass(frozen=True)
class State:
    momentum: torch.Tensor
    inner: Inner
    per_client: dict[int, torch.Tensor]
    lr: float
    name: str
    warm: bool
    none: None = None


def _state(seed: int = 0) -> State:
    g = torch.Generator().manual_seed(seed)
    return State(
        momentum=torch.randn(5, generator=g),
        inner=Inner(torch.randn(2, 3, generator=g, dtype=torch.float64), 3),
        per_client={4: torch.randint(0, 9, (3,), generator=g)},
        lr=0.1,
        name="ef",
        warm=True,
    )


def _books() -> Books:
    books = Books.start(6, sparse_download=True).add({"upload": 123, "timeouts": 2}).next_row().add({"dense": 7})
    ledger = DownloadLedger(torch.tensor([0, 3, 0, 2, 1, 3], dtype=torch.int32), {5: 2, 9: 3})
    return replace(books, dp_rounds=3, last_loss=0.25, homes={5: 1}, node_cid={1: 5}, applied={5: 3}, ledger=ledger)


def _ckpt(run_dir: Path) -> checkpoint.Checkpoint:
    (run_dir / "metrics.jsonl").write_text('{"round": 1}\n')
    return checkpoint.Checkpoint(
        round=3,
        weights=torch.randn(7, generator=torch.Generator().manual_seed(1)),
        state=checkpoint.state_to_tree(_state()),
        books=checkpoint.books_to_tree(_books()),
        noise=torch.Generator().manual_seed(5).get_state(),
        rng=checkpoint.capture_rng(),
        logs=checkpoint.log_sizes(run_dir),
        elapsed=12.375,
    )


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


CFG = RunConfig.from_mapping({})


def test_a_checkpoint_round_trips_every_field_bit_for_bit_in_one_checksummed_file(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path)
    path = checkpoint.save(tmp_path, CFG, ckpt)
    assert path == tmp_path / "checkpoint.pt" and sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.pt",
        "metrics.jsonl",
    ]
    raw = path.read_bytes()
    head = len(b"fedsketch-checkpoint\n")
    assert (
        raw[:head] == b"fedsketch-checkpoint\n" and hashlib.sha256(raw[head + 32 :]).digest() == raw[head : head + 32]
    )
    back = checkpoint.load(tmp_path, CFG)
    assert back is not None
    for field in fields(ckpt):
        assert _same(getattr(ckpt, field.name), getattr(back, field.name)), field.name
    assert checkpoint.load(tmp_path / "metrics.jsonl", CFG) is None  # no checkpoint there


def _write(run_dir: Path, body: bytes) -> None:
    (run_dir / checkpoint.FILE).write_bytes(checkpoint.MAGIC + hashlib.sha256(body).digest() + body)


def _tree(ckpt: checkpoint.Checkpoint, **changes: object) -> bytes:
    out = io.BytesIO()
    torch.save({"version": checkpoint.VERSION, "config": checkpoint.fingerprint(CFG), **asdict(ckpt), **changes}, out)
    return out.getvalue()


def test_a_checkpoint_that_must_not_be_resumed_is_refused_saying_why(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path)
    refuse = f"refusing to resume from {tmp_path / checkpoint.FILE}: "
    cases = [
        (checkpoint.MAGIC + bytes(31), "it is not a fedsketch checkpoint (bad header). Delete it to start over."),
        (
            b"x" + checkpoint.MAGIC + bytes(40),
            "it is not a fedsketch checkpoint (bad header). Delete it to start over.",
        ),
        (
            checkpoint.MAGIC + bytes(32) + b"body",
            "it is corrupt (checksum mismatch: truncated or modified). Delete it to start over.",
        ),
    ]
    for raw, why in cases:
        (tmp_path / checkpoint.FILE).write_bytes(raw)
        with pytest.raises(CheckpointError) as refused:
            checkpoint.load(tmp_path, CFG)
        assert str(refused.value) == refuse + why
    _write(tmp_path, b"")  # a header and nothing after it: read, and refused as unreadable
    with pytest.raises(CheckpointError, match=r"^" + re.escape(refuse + "it cannot be read (") + r"EOFError: .*\)$"):
        checkpoint.load(tmp_path, CFG)
    _write(tmp_path, _tree(ckpt, extra=1))
    with pytest.raises(CheckpointError, match=re.escape(refuse + "it cannot be read (TypeError: ") + ".*'extra'"):
        checkpoint.load(tmp_path, CFG)
    _write(tmp_path, _tree(ckpt, version=1))
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(tmp_path, CFG)
    assert str(refused.value) == refuse + "it has format version 1; this fedsketch reads 2"


def test_a_checkpoint_holding_an_arbitrary_object_is_refused_not_built(tmp_path: Path) -> None:
    """The body is read with ``weights_only``: tensors and plain containers, never a pickled object."""
    _write(tmp_path, _tree(_ckpt(tmp_path), state=Inner(torch.zeros(2), 1)))
    with pytest.raises(CheckpointError, match=r"it cannot be read \(UnpicklingError: .*Weights only load failed"):
        checkpoint.load(tmp_path, CFG)


def test_a_checkpoint_of_other_settings_names_each_and_both_values(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, CFG, _ckpt(tmp_path))
    other = RunConfig.from_mapping({"lr": 0.2, "seed": 3, "eval-every": 1, "round-timeout": 5.0})
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(tmp_path, other)
    assert str(refused.value) == (
        f"refusing to resume from {tmp_path / checkpoint.FILE}: it was written by a run with other settings "
        "('lr' 0.1 -> 0.2; 'seed' 0 -> 3). Use another out-dir, or delete the checkpoint to start over."
    )


def test_logs_may_grow_after_a_checkpoint_but_not_shrink(tmp_path: Path) -> None:
    ckpt = replace(_ckpt(tmp_path), logs={"metrics.jsonl": 13, "rounds.jsonl": 0})
    checkpoint.save(tmp_path, CFG, ckpt)
    assert checkpoint.load(tmp_path, CFG) is not None  # each log as long as it was; rounds.jsonl absent
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n')
    assert checkpoint.load(tmp_path, CFG) is not None
    checkpoint.save(tmp_path, CFG, replace(ckpt, logs={"metrics.jsonl": 13, "rounds.jsonl": 4}))
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(tmp_path, CFG)
    assert str(refused.value).endswith(
        ": rounds.jsonl has 0 bytes, fewer than the 4 it had at round 3 (was it edited?)"
    )
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "rounds.jsonl").write_text("{}\n{}\n")
    with pytest.raises(CheckpointError, match=": metrics.jsonl has 3 bytes, fewer than the 13 it had at round 3 "):
        checkpoint.load(tmp_path, CFG)


def test_logs_are_measured_and_cut_back_to_their_sizes(tmp_path: Path) -> None:
    assert checkpoint.log_sizes(tmp_path) == {"metrics.jsonl": 0, "rounds.jsonl": 0}
    (tmp_path / "metrics.jsonl").write_text("0123456789")
    (tmp_path / "rounds.jsonl").write_text("abcdef")
    (tmp_path / "flower.log").write_text("kept")
    assert checkpoint.log_sizes(tmp_path) == {"metrics.jsonl": 10, "rounds.jsonl": 6}
    checkpoint.rewind_logs(tmp_path, {"metrics.jsonl": 4})
    assert (tmp_path / "metrics.jsonl").read_text() == "0123" and (tmp_path / "rounds.jsonl").read_text() == ""
    assert (tmp_path / "flower.log").read_text() == "kept"
    (tmp_path / "rounds.jsonl").unlink()
    checkpoint.rewind_logs(tmp_path, {"metrics.jsonl": 2, "rounds.jsonl": 3})
    assert (tmp_path / "metrics.jsonl").read_text() == "01" and not (tmp_path / "rounds.jsonl").exists()


def test_a_state_round_trips_through_its_tree_as_detached_cpu_copies() -> None:
    state = _state()
    grad = torch.ones(5, requires_grad=True) * 2
    tree = checkpoint.state_to_tree(replace(state, momentum=grad))
    assert isinstance(tree, dict) and not tree["momentum"].requires_grad
    assert _same(tree["inner"], {"error": state.inner.error, "steps": 3}) and tree["none"] is None
    tree = checkpoint.state_to_tree(state)
    state.momentum.add_(1)  # the tree is a copy
    assert not torch.equal(tree["momentum"], state.momentum)  # type: ignore[index]
    back = checkpoint.state_from_tree(_state(seed=9), tree)
    assert type(back) is State and _same(checkpoint.state_to_tree(back), tree)
    with pytest.raises(TypeError, match="^cannot checkpoint a state holding object$"):
        checkpoint.state_to_tree({"x": object()})
    with pytest.raises(TypeError, match="^cannot checkpoint a state holding type$"):
        checkpoint.state_to_tree(State)  # a dataclass itself, not an instance


def test_a_saved_state_of_another_shape_or_kind_is_refused_naming_where() -> None:
    template, tree = _state(), checkpoint.state_to_tree(_state())
    assert isinstance(tree, dict)
    cases = [
        (
            {**tree, "momentum": torch.zeros(4)},
            "checkpoint state.momentum is torch.float32[4]; this run's is torch.float32[5]",
        ),
        (
            {**tree, "inner": {**tree["inner"], "error": tree["inner"]["error"].float()}},
            "checkpoint state.inner.error is torch.float32[2, 3]; this run's is torch.float64[2, 3]",
        ),
        ({**tree, "momentum": [0.0] * 5}, "checkpoint state.momentum is list; this run's is torch.float32[5]"),
        (
            {**tree, "inner": {"error": tree["inner"]["error"]}},
            "checkpoint state.inner has fields ['error']; this run's has ['error', 'steps']",
        ),
        ({**tree, "inner": [1]}, "checkpoint state.inner has fields list; this run's has ['error', 'steps']"),
        ({**tree, "per_client": {4: 1.0}}, "checkpoint state.per_client is not a mapping of tensors"),
        ({**tree, "per_client": [torch.zeros(1)]}, "checkpoint state.per_client is not a mapping of tensors"),
        ({**tree, "lr": 1}, "checkpoint state.lr is int; this run's is float"),
        ({**tree, "warm": 1}, "checkpoint state.warm is int; this run's is bool"),
    ]
    for bad, message in cases:
        with pytest.raises(CheckpointError) as refused:
            checkpoint.state_from_tree(template, bad)
        assert str(refused.value) == message
    with pytest.raises(CheckpointError, match="^checkpoint method is int; this run's is torch.float32"):
        checkpoint.state_from_tree(torch.zeros(2), 3, "method")
    keys = checkpoint.state_from_tree(template, {**tree, "per_client": {7: torch.ones(2)}})
    assert list(keys.per_client) == [7]  # type: ignore[attr-defined]


def test_the_books_round_trip_and_books_of_another_run_are_refused() -> None:
    books = _books()
    tree = checkpoint.books_to_tree(books)
    books.ledger.changed_at.add_(1)  # the tree holds a copy
    back = checkpoint.books_from_tree(Books.start(6, sparse_download=True), tree)
    assert back == replace(_books(), ledger=back.ledger) and back.ledger.synced == {5: 2, 9: 3}
    assert torch.equal(back.ledger.changed_at, _books().ledger.changed_at)
    template = Books.start(6, sparse_download=True)
    totals = {k: v for k, v in tree["totals"].items() if k != "dense"}
    names = sorted(f.name for f in fields(Books))
    cases = [
        ({**tree, "extra": 1}, f"checkpoint books have fields {sorted([*names, 'extra'])}; expected {names}"),
        ([1], f"checkpoint books have fields list; expected {names}"),
        ({**tree, "totals": totals}, f"checkpoint counters are {sorted(totals)}; expected {sorted(template.totals)}"),
        (
            {**tree, "since_row": totals},
            f"checkpoint counters are {sorted(tree['totals'])}; expected {sorted(template.totals)}",
        ),
        ({**tree, "ledger": {"changed_at": torch.zeros(6)}}, "checkpoint download ledger has fields ['changed_at']"),
        ({**tree, "ledger": None}, "checkpoint download ledger has fields NoneType"),
        (
            {**tree, "ledger": {**tree["ledger"], "changed_at": torch.zeros(5, dtype=torch.int32)}},
            "checkpoint books.ledger.changed_at is torch.int32[5]; this run's is torch.int32[6]",
        ),
    ]
    for bad, message in cases:
        with pytest.raises(CheckpointError) as refused:
            checkpoint.books_from_tree(template, bad)
        assert str(refused.value) == message


def test_the_global_generators_are_restored_to_draw_the_same_numbers() -> None:
    def draw() -> tuple[object, ...]:
        return random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()

    random.gauss(0, 1)  # both gaussian generators now hold a second, cached value
    np.random.standard_normal()
    saved = checkpoint.capture_rng()
    first = draw()
    checkpoint.restore_rng(saved)
    assert draw() == first


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_cuda_device_the_state_returns_there_and_the_cuda_generators_draw_the_same() -> None:
    template = replace(_state(), momentum=torch.zeros(5, device="cuda"))
    back = checkpoint.state_from_tree(template, checkpoint.state_to_tree(_state()))
    assert back.momentum.device.type == "cuda"  # type: ignore[attr-defined]
    saved = checkpoint.capture_rng()
    first = torch.rand(3, device="cuda").tolist()
    checkpoint.restore_rng(saved)
    assert torch.rand(3, device="cuda").tolist() == first
    checkpoint.restore_rng({k: v for k, v in saved.items() if k != "cuda"})  # a CPU run's checkpoint resumes here
