"""bench_peer's tables: medians over runs, and each run's ratio to the run beside it."""

from __future__ import annotations

import pytest

from experiments.bench.peer_tables import Run, print_table


def _run(round_s: float, total_s: float, peak_mb: float) -> Run:
    return {"round_s": round_s, "total_s": total_s, "first_round_s": 1.0, "peak_mb": peak_mb, "accuracy": 0.5}


def test_ratios_are_taken_run_by_run_and_the_sketchs_cost_against_fedavg(capsys: pytest.CaptureFixture[str]) -> None:
    results = {
        "pfl": [_run(1.0, 10.0, 100.0), _run(2.0, 20.0, 100.0), _run(1.0, 10.0, 100.0)],
        "fedsketch FedAvg (2 nodes)": [_run(0.5, 12.0, 150.0), _run(2.0, 20.0, 150.0), _run(1.5, 10.0, 150.0)],
        "fedsketch FetchSGD (2 nodes)": [_run(1.0, 12.0, 75.0), _run(2.2, 30.0, 75.0), _run(1.5, 10.0, 75.0)],
    }
    print_table(results)
    lines = capsys.readouterr().out.splitlines()
    fedavg = next(line for line in lines if line.startswith("| fedsketch FedAvg (2 nodes) | 1.0"))
    # a round: 0.5/1, 2/2, 1.5/1 -> median 1.00 of 0.50, 1.00, 1.50 (medians of each side would give 1.5/1 = 1.50)
    assert "| 1.00 (0.50-1.50): 0.50, 1.00, 1.50 | 1.00 (1.00-1.20): 1.20, 1.00, 1.00 | 1.50 (1.50-1.50)" in fedavg
    cost = next(line for line in lines if line.startswith("| FetchSGD / FedAvg |"))
    assert "| 1.10 (1.00-2.00): 2.00, 1.10, 1.00 | 1.00 (1.00-1.50): 1.00, 1.50, 1.00 | 0.50 (0.50-0.50)" in cost
    assert "| pfl | 1.000 | 10.0 s |" in "\n".join(lines)
