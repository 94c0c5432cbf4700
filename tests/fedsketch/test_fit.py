"""The checks that need the model's size: k and download-k against d, the method's own limits, the clients' kept
state in memory or on disk (fedsketch/fit.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from fedsketch.config import ConfigError, RunConfig
from fedsketch.fit import check_against_model, client_state_bytes, describe_client_state

TOPK = {"strategy": "local_topk", "num-clients": 16, "clients-per-round": 4, "k": 10, "sketch-cols": 40}
"""local_topk keeps one error vector a client (two with the pending one)."""


def test_the_clients_state_is_two_float32_vectors_of_d_per_vector_kept_for_every_client() -> None:
    cfg = RunConfig.from_mapping(TOPK)
    assert client_state_bytes(cfg, 1_000) == 2 * 4 * 1_000 * 16
    sketched = RunConfig.from_mapping({**TOPK, "strategy": "sketched_sgd"})
    assert client_state_bytes(sketched, 1_000) == 2 * 2 * 4 * 1_000 * 16  # its two vectors a client
    assert client_state_bytes(RunConfig.from_mapping({**TOPK, "strategy": "fetchsgd"}), 1_000) == 0


def test_the_state_reads_per_client_and_in_all() -> None:
    cfg = RunConfig.from_mapping({**TOPK, "num-clients": 300})
    assert describe_client_state(cfg, 2_000_000) == (
        "local_topk keeps 1 float32 vector(s) of d=2,000,000 per client, committed and pending: "
        "300 clients x 15.3 MiB = 4.47 GiB of client state"
    )


def test_k_and_download_k_may_reach_the_models_size_but_not_pass_it() -> None:
    check_against_model(RunConfig.from_mapping({**TOPK, "k": 50, "sketch-cols": 200}), 50)
    with pytest.raises(ConfigError, match=r"^setting 'k' \(51\) exceeds the model's 50 parameters$"):
        check_against_model(RunConfig.from_mapping({**TOPK, "k": 51, "sketch-cols": 204}), 50)
    check_against_model(RunConfig.from_mapping({**TOPK, "download-k": 50}), 50)
    with pytest.raises(ConfigError, match=r"^setting 'download-k' \(51\) exceeds the model's 50 parameters$"):
        check_against_model(RunConfig.from_mapping({**TOPK, "download-k": 51}), 50)


def test_the_state_in_memory_may_fill_max_client_state_mb_but_not_pass_it() -> None:
    cfg = RunConfig.from_mapping({**TOPK, "max-client-state-mb": 1})
    check_against_model(cfg, 8_192)  # 16 clients x 2 x 4 x 8,192 B: exactly 1 MiB
    with pytest.raises(ConfigError) as caught:
        check_against_model(cfg, 8_193)
    assert str(caught.value) == (
        f"{describe_client_state(cfg, 8_193)}, above setting 'max-client-state-mb' (1); lower 'num-clients', "
        "or raise 'max-client-state-mb' if the machine has the memory, or keep it on disk: client-state = 'disk'"
    )


def test_the_state_on_disk_is_held_to_the_free_space_of_the_out_dirs_file_system(tmp_path: Path) -> None:
    out = tmp_path / "not" / "yet"
    cfg = RunConfig.from_mapping({**TOPK, "client-state": "disk", "max-client-state-mb": 1, "out-dir": str(out)})
    check_against_model(cfg, 8_193)  # above the memory limit: on disk it does not apply
    free = shutil.disk_usage(tmp_path).free
    d = (free + 2**30) // (2 * 4 * 16) + 1  # 1 GiB beyond what is free: other tests' files come and go meanwhile
    with pytest.raises(ConfigError) as caught:
        check_against_model(RunConfig.from_mapping({**TOPK, "k": 10, "client-state": "disk", "out-dir": str(out)}), d)
    what = re.escape(describe_client_state(cfg, d))
    said = re.fullmatch(
        rf"{what}, more than the ([\d,.]+) GiB free under {re.escape(str(tmp_path))} \(setting 'client-state' = 'disk'\)",
        str(caught.value),
    )
    assert said is not None
    assert abs(float(said.group(1).replace(",", "")) - free / 2**30) < 0.5  # as free as it was a moment ago
