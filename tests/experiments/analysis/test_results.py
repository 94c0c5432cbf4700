"""An experiment folder's results (experiments/analysis/results.py), checked against the rows themselves.

Run folders are written here with random curves over several seeds; every figure the module gives
is recomputed from the rows by a reference written in this file (numpy, brute force).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import experiments
from experiments.analysis.results import (
    RunGroup,
    Spread,
    bytes_to_target,
    collect_groups,
    failed_replies,
    failure_reason,
    format_bytes,
    format_spread,
    pareto_front,
    reach,
    summarize,
)
from fedsketch.server import runlog

SEEDS = range(6)
UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def _curve(rng: np.random.Generator, strategy: str, seed: int) -> list[dict]:
    """A run's evaluated rounds: cumulative bytes that grow, an accuracy that wanders up and down."""
    n = int(rng.integers(1, 6))
    up, down, dense = (np.cumsum(rng.integers(1, 10**7, size=n)) for _ in range(3))
    return [
        {
            "round": 2 * (i + 1),
            "strategy": strategy,
            "seed": seed,
            "test_accuracy": round(float(rng.random()), 3),
            "cum_upload_bytes": int(up[i]),
            "cum_download_bytes": int(down[i]),
            "cum_dense_upload_bytes": int(up[i] + dense[i]),
        }
        for i in range(n)
    ]


def _group(rng: np.random.Generator, seeds: int) -> RunGroup:
    return RunGroup("m", "", tuple(tuple(_curve(rng, "m", s)) for s in range(seeds)))


def _write(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        runlog.append_metrics(folder, row)


def _first_reach(rows: list[dict], target: float) -> tuple[int, int] | None:
    """Reference: the bytes at the first row whose accuracy is at least the target."""
    hits = np.flatnonzero(np.array([r["test_accuracy"] for r in rows]) >= target)
    if hits.size == 0:
        return None
    row = rows[int(hits[0])]
    return row["cum_upload_bytes"], row["cum_upload_bytes"] + row["cum_download_bytes"]


def _spread_of(values: list[float]) -> tuple[float, float, float]:
    return float(np.mean(values)), float(np.min(values)), float(np.max(values))


def _as_tuple(spread: Spread) -> tuple[float, float, float]:
    return spread.mean, spread.low, spread.high


@pytest.mark.parametrize("seed", SEEDS)
def test_a_spread_is_the_mean_min_and_max(seed: int) -> None:
    values = list(np.random.default_rng(seed).normal(size=int(seed) + 1) * 10)
    assert _as_tuple(Spread.of(values)) == pytest.approx(_spread_of(values))


def test_a_spread_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="^a spread needs at least one value$"):
        Spread.of([])


@pytest.mark.parametrize("seed", SEEDS)
def test_a_summary_holds_each_seeds_last_row(seed: int) -> None:
    group = _group(np.random.default_rng(seed), seeds=1 + seed % 4)
    s = summarize(group)
    last = [rows[-1] for rows in group.seeds]
    up = [r["cum_upload_bytes"] for r in last]
    down = [r["cum_download_bytes"] for r in last]
    assert s.group is group
    assert _as_tuple(s.rounds) == pytest.approx(_spread_of([r["round"] for r in last]))
    assert _as_tuple(s.accuracy) == pytest.approx(_spread_of([r["test_accuracy"] for r in last]))
    assert _as_tuple(s.upload) == pytest.approx(_spread_of(up))
    assert _as_tuple(s.download) == pytest.approx(_spread_of(down))
    assert _as_tuple(s.total) == pytest.approx(_spread_of([u + d for u, d in zip(up, down, strict=True)]))
    ratios = [r["cum_dense_upload_bytes"] / r["cum_upload_bytes"] for r in last]
    assert _as_tuple(s.upload_compression) == pytest.approx(_spread_of(ratios))


@pytest.mark.parametrize("seed", SEEDS)
def test_bytes_to_a_target_are_those_of_the_first_round_that_reaches_it(seed: int) -> None:
    rows = _curve(np.random.default_rng(seed), "m", 0)
    targets = [r["test_accuracy"] for r in rows] + [0.0, 0.5, 1.0001]  # each row's own accuracy reaches it
    for target in targets:
        got = bytes_to_target(rows, target)
        assert got == _first_reach(rows, target)
        assert got is None or all(type(b) is int for b in got)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_group_reaches_a_target_only_if_every_seed_does(seed: int) -> None:
    group = _group(np.random.default_rng(seed), seeds=3)
    for target in (0.0, 0.3, 0.6, 0.9):
        hits = [_first_reach(list(rows), target) for rows in group.seeds]
        got = reach(summarize(group), target)
        assert (got.target, got.seeds_reached) == (target, sum(h is not None for h in hits))
        if None in hits:
            assert got.upload is None and got.total is None
        else:
            assert got.upload is not None and got.total is not None
            assert _as_tuple(got.upload) == pytest.approx(_spread_of([h[0] for h in hits if h]))
            assert _as_tuple(got.total) == pytest.approx(_spread_of([h[1] for h in hits if h]))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_pareto_front_is_every_undominated_point_by_bytes_then_accuracy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = [(float(b), float(a)) for b, a in rng.integers(0, 5, size=(12, 2))]  # small ranges: ties
    front = pareto_front(points)
    beaten = {i for i, (b, a) in enumerate(points) for bb, aa in points if bb <= b and aa >= a and (bb, aa) != (b, a)}
    assert sorted(front) == [i for i in range(len(points)) if i not in beaten]
    assert [points[i] for i in front] == sorted((points[i] for i in front), key=lambda p: (p[0], -p[1]))


@pytest.mark.parametrize("seed", SEEDS)
def test_bytes_read_back_from_their_text_in_the_largest_unit_they_fill(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in [*(10 ** rng.uniform(0, 15, size=40)), *(-(10 ** rng.uniform(0, 15, size=5)))]:
        for digits in (3, 5):
            value, unit = format_bytes(n, digits).split(" ")
            assert unit == max((u for u, s in UNITS.items() if abs(n) >= s), key=UNITS.__getitem__)
            tolerance = 0.5 if unit == "B" else abs(n) * 10 ** (1 - digits)
            assert float(value) * UNITS[unit] == pytest.approx(n, abs=tolerance)


def test_bytes_at_each_units_boundary() -> None:
    assert [format_bytes(n) for n in (0, 999, 1000, 999_499, 1e6, 1_190_000, 1e9 - 1, 1e9, 2e9, 1e12, 3.5e15)] == [
        "0 B",
        "999 B",
        "1 kB",
        "999 kB",
        "1 MB",
        "1.19 MB",
        "1e+03 MB",
        "1 GB",
        "2 GB",
        "1 TB",
        "3.5e+03 TB",
    ]
    assert (format_bytes(123_456), format_bytes(123_456, 5), format_bytes(-2500)) == ("123 kB", "123.46 kB", "-2.5 kB")


def test_a_spread_prints_its_band_unless_the_seeds_agree() -> None:
    assert format_spread(Spread(0.5, 0.5, 0.5), "{:.2f}".format) == "0.50"
    assert format_spread(Spread(2e6, 1e6, 3e6), format_bytes) == "2 MB (1 MB-3 MB)"


def _layout(root: Path, rng: np.random.Generator) -> dict[tuple[str, str], list[list[dict]]]:
    """Folders as ``runlog.run_dir`` lays them out, written in a random order; what each group should hold."""
    want: dict[tuple[str, str], list[list[dict]]] = {}
    cases = [
        (s, p, k)
        for s in ("fedavg", "fetchsgd")
        for p in ("", "cols300", "cols3000", "cols27000", "rows3/cols5000")
        for k in (0, 1, 10)
    ]
    for i in rng.permutation(len(cases))[: int(rng.integers(4, len(cases)))]:
        strategy, point, k = cases[i]
        folder = root / strategy / point if point else root / strategy
        rows = _curve(rng, strategy, k)
        _write(folder / f"seed{k}" if k else folder, rows)
        want.setdefault((strategy, point), []).append(rows)
    return want


def _point_key(point: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", point)]


@pytest.mark.parametrize("seed", SEEDS)
def test_collected_groups_hold_every_seeds_rows_sorted_by_strategy_point_and_seed(tmp_path: Path, seed: int) -> None:
    want = _layout(tmp_path, np.random.default_rng(seed))
    (tmp_path / "fedavg" / "empty").mkdir(parents=True, exist_ok=True)
    (tmp_path / "fedavg" / "empty" / "metrics.jsonl").write_text("")  # a run not yet evaluated: no group
    groups = collect_groups(tmp_path)
    keys = sorted(want, key=lambda k: (k[0], _point_key(k[1])))
    assert [(g.strategy, g.point) for g in groups] == keys
    for g in groups:
        expected = sorted(want[(g.strategy, g.point)], key=lambda rows: rows[0]["seed"])
        assert [list(rows) for rows in g.seeds] == expected
        assert g.stopped == ()


def test_a_group_takes_its_strategy_from_the_rows_and_notes_each_stopped_seed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for k in (0, 2, 11):
        folder = tmp_path / "renamed" / "k20" / (f"seed{k}" if k else "")
        _write(folder, _curve(rng, "true_topk", k))
        if k:
            runlog.write_status(folder, "interrupted", "SIGINT", 50)
    (group,) = collect_groups(tmp_path)
    assert (group.strategy, group.point, group.label) == ("true_topk", "k20", "true_topk k20")
    assert [rows[0]["seed"] for rows in group.seeds] == [0, 2, 11]
    last = {k: group.seeds[i][-1]["round"] for i, k in enumerate((0, 2, 11))}
    assert group.stopped == (
        f"seed 11 interrupted (SIGINT) after round {last[11]} of 50",
        f"seed 2 interrupted (SIGINT) after round {last[2]} of 50",
    )


def test_a_missing_or_empty_folder_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"^no experiment folder at {re.escape(str(tmp_path / 'x'))}$"):
        collect_groups(tmp_path / "x")
    _write(tmp_path / "fedavg", [])
    (tmp_path / "fedavg" / "metrics.jsonl").write_text("\n")
    with pytest.raises(FileNotFoundError, match=f"^no metrics.jsonl under {re.escape(str(tmp_path))}$"):
        collect_groups(tmp_path)


def _rounds(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / runlog.ROUNDS).write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("seed", SEEDS)
def test_failed_replies_count_every_kind_over_the_rounds(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    kinds = ("rejected", "client_errors", "timeouts")
    rows = [{"round": r, **{k: int(rng.integers(0, 3)) for k in kinds if rng.random() < 0.7}} for r in range(1, 6)]
    first = next((r["round"] for r in rows if any(r.get(k) for k in kinds)), None)
    if first is not None:
        rows[first - 1]["first_failure"] = f"ValueError: bad reply {seed}"
    _rounds(tmp_path, rows)
    totals = {k: sum(r.get(k, 0) for r in rows) for k in kinds}
    line = failed_replies(tmp_path)
    if first is None:
        assert line == ""
        return
    named = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in totals.items() if n)
    want = (
        f"{sum(totals.values())} client replies failed ({named}); first, in round {first}: ValueError: bad reply {seed}"
    )
    assert line == want


def test_failed_replies_without_a_reason_or_a_log(tmp_path: Path) -> None:
    assert failed_replies(tmp_path) == ""
    _rounds(tmp_path, [{"round": 1, "timeouts": 2}, {"round": 2, "rejected": 1, "first_failure": ""}])
    assert failed_replies(tmp_path) == "3 client replies failed (1 rejected, 2 timeouts)"


def test_the_failure_reason_is_the_last_exception_the_log_records(tmp_path: Path) -> None:
    assert failure_reason(tmp_path) == ""
    log = tmp_path / "flower.log"
    log.write_bytes(b"INFO: starting\nTraceback (most recent call last):\n  ValueError: first\n\xff\xfe\n")
    assert failure_reason(tmp_path) == "ValueError: first"
    with log.open("a", encoding="utf-8") as f:
        f.write("  torch.cuda.OutOfMemoryError: CUDA out of memory: 2 GiB\nErrors: not one\nINFO: done\n")
    assert failure_reason(tmp_path) == "OutOfMemoryError: CUDA out of memory: 2 GiB"
    log.write_text("flwr.common.SomeException: lost\nError: plain\n")
    assert failure_reason(tmp_path) == "Error: plain"
    log.write_text("INFO: all well\n")
    assert failure_reason(tmp_path) == ""


def test_the_failure_reason_is_read_as_utf_8_under_any_locale(tmp_path: Path) -> None:
    """flower.log is UTF-8: a process under an ASCII locale (no UTF-8 mode) reads a non-ASCII reason the same."""
    want = "ValueError: données perdues à 2 GiB"
    (tmp_path / "flower.log").write_text(want + "\n", encoding="utf-8")
    assert failure_reason(tmp_path) == want
    root = Path(experiments.__file__).resolve().parents[1]  # the code under test, wherever it was imported from
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONPATH": str(root)}
    code = (
        "import sys; from pathlib import Path; from experiments.analysis.results import failure_reason; "
        "print(ascii(failure_reason(Path(sys.argv[1]))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], check=False, cwd=root, env=env, capture_output=True, text=True
    )
    assert (run.returncode, run.stdout.strip()) == (0, ascii(want)), run.stderr[-2000:]
