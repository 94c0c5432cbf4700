"""Local top-k with and without a client error memory (``local-topk-error``).

``client``: each client sends the top-k of its update plus the error it kept,
and keeps what that top-k left out (Stich et al., NeurIPS 2018). ``none``: the
top-k of its own update, nothing kept (FetchSGD's local top-k baseline,
Rothchild et al., ICML 2020). Rounds run through the real strategy and the real
ClientApp in one process (:mod:`experiments.running.inprocess_grid`); every client takes part
in every round, and each upload is checked against the client's update, which
the test recomputes from the model the server sent and the client's own data.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid

from bridge.flower import task_identity
from bridge.messages import read_request, record_to_payload
from experiments.cli import main as fedsketch_main
from fedsketch import wire
from fedsketch.client.state import state_root
from fedsketch.compress.topk import decompress
from fedsketch.config import ConfigError, RunConfig
from fedsketch.data.run import load_data
from fedsketch.fit import check_against_model, client_state_bytes
from fedsketch.server import runlog
from fedsketch.task import local_spec, make_model
from fedsketch.training.local import client_generator, local_update
from strategies.server_app import build_strategy
from tests.federation import TestGrid
from tests.method_helpers import encode

CLIENTS, K = 4, 20
SETTINGS = {
    "strategy": "local_topk",
    "num-clients": CLIENTS,
    "clients-per-round": CLIENTS,
    "model-hidden": 8,
    "k": K,
    "num-rounds": 2,
    "eval-every": 1,
}


class Seen:
    """What went over the wire: the model each round sent, and each client's upload per round."""

    def __init__(self) -> None:
        self.weights: dict[int, np.ndarray] = {}
        self.uploads: dict[tuple[int, int], dict[str, np.ndarray]] = {}

    def __call__(self, requests: list[Message], replies: list[Message]) -> list[Message]:
        rnd = read_request(requests[0].content).server_round
        for request in requests:
            weights = read_request(request.content).weights
            assert weights is not None
            self.weights[rnd] = weights
        for reply in replies:
            for key, record in reply.content.items():
                parsed = wire.parse_cid(key)
                if parsed is not None and parsed[0] == "update" and isinstance(record, ArrayRecord):
                    self.uploads[rnd, parsed[1]] = record_to_payload(record)
        return replies


def run(out: Path, error: str, **settings: Any) -> tuple[RunConfig, Seen, TestGrid]:
    cfg = RunConfig.from_mapping({**SETTINGS, "local-topk-error": error, "out-dir": str(out), **settings})
    seen = Seen()
    grid = TestGrid(cfg.to_mapping(), num_nodes=2, tamper=seen)
    with task_identity():
        build_strategy(cfg, out / "metrics").start(cast(Grid, grid))
    assert sorted(seen.uploads) == [(r, c) for r in (1, 2) for c in range(CLIENTS)]
    return cfg, seen, grid


def update_of(cfg: RunConfig, weights: np.ndarray, cid: int, rnd: int) -> torch.Tensor:
    """Client ``cid``'s update in round ``rnd`` from the model it was sent, computed apart from the ClientApp."""
    data = load_data(cfg)
    x, y = data.client_data(cid)
    model = make_model(cfg, data)
    gen = client_generator(cfg.seed, rnd, cid)
    return local_update(model, torch.from_numpy(weights), x, y, local_spec(cfg), gen).update


def top_k(vec: torch.Tensor, k: int = K) -> torch.Tensor:
    """The dense vector that keeps ``vec``'s k largest-magnitude coordinates, zeros elsewhere."""
    out = torch.zeros_like(vec)
    idx = torch.topk(vec.abs(), k).indices
    out[idx] = vec[idx]
    return out


def decoded(seen: Seen, rnd: int, cid: int, d: int) -> torch.Tensor:
    return decompress(seen.uploads[rnd, cid], d)


def kept_anything(grid: TestGrid) -> bool:
    return any(wire.state_key(cid) in ctx.state for ctx in grid.contexts.values() for cid in range(CLIENTS))


def test_stateless_uploads_are_the_top_k_of_each_rounds_own_update(tmp_path: Path) -> None:
    """Positions and values are exactly the update's top-k, the second time as the first."""
    cfg, seen, grid = run(tmp_path, "none")
    assert not np.array_equal(seen.weights[1], seen.weights[2])  # the model moved between the rounds
    d = seen.weights[1].size
    for rnd in (1, 2):
        for cid in range(CLIENTS):
            update = update_of(cfg, seen.weights[rnd], cid, rnd)
            got = decoded(seen, rnd, cid, d)
            assert torch.equal(got, top_k(update)), (rnd, cid)
            assert set(got.nonzero().flatten().tolist()) == set(torch.topk(update.abs(), K).indices.tolist())
    assert not kept_anything(grid)


def test_with_client_memory_the_second_upload_carries_the_first_ones_error(tmp_path: Path) -> None:
    """The default: round 2 sends top-k(update_2 + update_1 - top-k(update_1))."""
    cfg, seen, grid = run(tmp_path, "client")
    d = seen.weights[1].size
    for cid in range(CLIENTS):
        first = update_of(cfg, seen.weights[1], cid, 1)
        second = update_of(cfg, seen.weights[2], cid, 2)
        assert torch.equal(decoded(seen, 1, cid, d), top_k(first))
        carried = second + (first - top_k(first))
        assert torch.equal(decoded(seen, 2, cid, d), top_k(carried)), cid
        assert not torch.equal(decoded(seen, 2, cid, d), top_k(second)), cid
    assert kept_anything(grid)


def test_stateless_clients_write_nothing_to_disk(tmp_path: Path) -> None:
    cfg, _, grid = run(tmp_path, "none", **{"client-state": "disk"})
    assert not state_root(cfg).exists() or not any(state_root(cfg).rglob("*.npz"))
    assert not kept_anything(grid)


def test_a_stale_error_never_reaches_a_stateless_upload() -> None:
    """Whatever a client might hold, ``none`` sends the top-k of the update alone, and returns nothing to keep."""
    update = torch.randn(500, generator=torch.Generator().manual_seed(3))
    cfg = RunConfig.from_mapping({"strategy": "local_topk", "k": K, "local-topk-error": "none"})
    payload, state = encode(cfg, update, state={"error": 100 * torch.ones(500)})
    assert state == {} and torch.equal(decompress(payload, 500), top_k(update))


def test_the_validator_sees_stateless_local_topk_as_needing_no_memory_or_disk(tmp_path: Path) -> None:
    """10,000 clients of a 10^8-parameter model: "none" keeps nothing; "client" is refused."""
    big = {
        "strategy": "local_topk",
        "num-clients": 10_000,
        "clients-per-round": 10,
        "k": 100,
        "out-dir": str(tmp_path),
    }
    d = 10**8  # "client" would keep 2 x 4 d bytes a client: 8 TB
    none = {**big, "local-topk-error": "none"}
    for settings in (none, {**none, "client-state": "disk"}, {**none, "max-client-state-mb": 1}):
        cfg = RunConfig.from_mapping(settings)
        assert client_state_bytes(cfg, d) == 0
        check_against_model(cfg, d)
    RunConfig.from_mapping({**none, "checkpoint-every": 2})  # no client state for a restart to lose
    assert client_state_bytes(RunConfig.from_mapping(big), d) == 8 * d * 10_000
    with pytest.raises(ConfigError, match="'max-client-state-mb'"):
        check_against_model(RunConfig.from_mapping(big), d)
    with pytest.raises(ConfigError, match=r"free under .* \(setting 'client-state' = 'disk'\)"):
        check_against_model(RunConfig.from_mapping({**big, "client-state": "disk"}), d)
    with pytest.raises(ConfigError, match="'checkpoint-every'"):
        RunConfig.from_mapping({**big, "checkpoint-every": 2})


@pytest.mark.parametrize("value", ["virtual", "local", 1])
def test_a_bad_value_is_refused_in_one_line_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match="setting 'local-topk-error'") as refused:
        RunConfig.from_mapping({"strategy": "local_topk", "local-topk-error": value})
    assert "\n" not in str(refused.value)


def test_the_command_line_refuses_a_bad_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--strategies", "local_topk", "--set", "local-topk-error=virtual", "--set", "num-rounds=1"]
    args += ["--out", str(tmp_path)]
    assert fedsketch_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'local-topk-error' must be one of client, none; got 'virtual'" in err
    assert not any(tmp_path.iterdir())


def _watch(folder: Path, seen: set[Path], stop: threading.Event) -> None:
    """Every state file that appears under ``folder`` while the run goes on (the run deletes the folder at its end)."""
    while not stop.wait(0.005):
        try:
            seen.update(folder.rglob("*.npz") if folder.is_dir() else ())
        except OSError:  # removed while walked
            continue


@pytest.mark.slow
def test_stateless_local_topk_through_flower_writes_no_state_and_checkpoints(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """A real Flower simulation: every client in every round, state "on disk", a checkpoint every round."""
    settings = {
        "experiment": "stateless",
        "model": "mlp",
        "model-hidden": 16,
        "num-clients": 6,
        "clients-per-round": 6,
        "num-rounds": 3,
        "eval-every": 1,
        "k": 50,
        "local-topk-error": "none",
        "client-state": "disk",
        "checkpoint-every": 1,
    }
    args = ["run", "--out", str(tmp_path), "--strategies", "local_topk", "--no-plot"]
    for key, value in settings.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    run_dir = tmp_path / "stateless" / "local_topk"
    seen: set[Path] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(run_dir / "client-state", seen, stop), daemon=True)
    watcher.start()
    try:
        assert fedsketch_main(args) == 0
    finally:
        stop.set()
        watcher.join()
    rows = runlog.read_metrics(run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["clients"] == 6 and r["failures"] == 0 and r["values_over_k"] == 1.0 for r in rows)
    assert not seen, f"a stateless client wrote {sorted(seen)}"
    assert (run_dir / runlog.CHECKPOINT).exists()
    assert json.loads((run_dir / "config.json").read_text())["local-topk-error"] == "none"
