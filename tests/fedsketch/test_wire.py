"""A config's values are read with their type checked: a wrong one is refused in one line naming its key."""

from __future__ import annotations

import re

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from bridge.messages import model_record, read_request
from bridge.runtime.simulation_backend import InProcessBackend
from fedsketch import wire
from fedsketch.wire import config_float, config_int, config_ints


def _request(config: dict[str, object]) -> RecordDict:
    record = ConfigRecord(config)  # type: ignore[arg-type]  # wrong-typed values on purpose
    return RecordDict({wire.MODEL_KEY: model_record(np.zeros(3, np.float32)), wire.CONFIG_KEY: record})


def test_a_request_reads_its_round_clients_and_phase() -> None:
    request = read_request(_request({wire.ROUND: 4, wire.CIDS: [7, 2], "lr": 0.5}))
    assert (request.server_round, request.cids, request.phase, request.base_round) == (4, [7, 2], 1, 0)
    assert request.weights is not None and request.config["lr"] == 0.5


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        (wire.ROUND, "4", "config 'server-round' must be an int; got str '4'"),
        (wire.ROUND, 4.0, "config 'server-round' must be an int; got float 4.0"),
        (wire.ROUND, True, "config 'server-round' must be an int; got bool True"),
        (wire.PHASE, [2], "config 'phase' must be an int; got list [2]"),
        (wire.CIDS, 7, "config 'cids' must be a list of ints; got int 7"),
        (wire.CIDS, [1.0, 2.0], "config 'cids' must be a list of ints; got list [1.0, 2.0]"),
        (wire.CIDS, ["1"], "config 'cids' must be a list of ints; got list ['1']"),
    ],
)
def test_a_wrong_typed_request_value_is_refused_naming_its_key(key: str, value: object, error: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        read_request(_request({wire.ROUND: 4, wire.CIDS: [7], key: value}))


def test_a_request_without_its_round_says_so() -> None:
    with pytest.raises(ValueError, match="^config has no 'server-round'$"):
        read_request(_request({wire.CIDS: [7]}))


def test_readers_give_defaults_and_plain_values() -> None:
    config: dict[str, object] = {"n": 3, "ids": [-1, 5], "x": 2, "y": 0.25, "none": None}
    assert (config_int(config, "n"), config_int(config, "absent", 9)) == (3, 9)
    assert (config_ints(config, "ids"), config_ints(config, "absent")) == ([-1, 5], [])
    assert (config_float(config, "x", 1.0), config_float(config, "y", 1.0)) == (2.0, 0.25)
    assert (config_float(config, "absent", 1.0), config_float(config, "none", 1.0)) == (1.0, 1.0)
    with pytest.raises(ValueError, match="^config 'ids' must be an int; got list"):
        config_int(config, "ids")


def test_a_backend_config_with_a_wrong_typed_cpu_count_is_refused() -> None:
    with pytest.raises(ValueError, match="^config 'num_cpus' must be a number; got str '2'$"):
        InProcessBackend({"client_resources": {"num_cpus": "2"}, "init_args": {}})
    with pytest.raises(ValueError, match="^config 'num_cpus' must be a number; got bool True$"):
        InProcessBackend({"client_resources": {"num_cpus": True}, "init_args": {}})


def test_every_client_key_names_its_kind_and_client_and_nothing_else_parses() -> None:
    makers = {"update": wire.update_key, "metrics": wire.metrics_key, "failure": wire.failure_key}
    for cid in (0, 7, 12345):
        for kind, key_of in {**makers, "rejected": wire.rejected_key}.items():
            assert wire.parse_cid(key_of(cid)) == (kind, cid)
        assert wire.request_cid(wire.request_key(cid)) == cid
        for other in (wire.state_key(cid), wire.diagnostic_key(cid), wire.request_key(cid)):
            assert wire.parse_cid(other) is None
        assert wire.request_cid(wire.metrics_key(cid)) is None  # "metrics." is as long as "request."
    assert wire.request_cid(wire.request_key(wire.NEW_CLIENT)) == wire.NEW_CLIENT
    for key in ("update.", "update.x", "update.-3", "updates.4", "request.", "request.news", "model", ""):
        assert wire.parse_cid(key) is None and wire.request_cid(key) is None, key


def test_a_wrong_value_is_shown_by_its_first_sixty_characters() -> None:
    value = "x" * 100
    with pytest.raises(ValueError) as refused:
        config_int({"n": value}, "n")
    assert str(refused.value) == f"config 'n' must be an int; got str {repr(value)[:60]}"
