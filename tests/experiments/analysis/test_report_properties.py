"""An experiment's report (experiments/analysis/report.py) on run folders written by hand, for several seeds.

Every number of ``report.csv`` and every cell of ``report.md`` is compared with what the metrics
rows say, recomputed here with numpy and brute force. The end-to-end sweep that feeds the same
report from real runs is in ``test_report.py``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import experiments
from experiments.analysis.equal_bytes import compare
from experiments.analysis.report import build_report, to_csv, to_markdown, write_report
from experiments.analysis.results import collect_groups, format_bytes
from fedsketch.server import runlog
from tests import run_folders

Rows = list[dict[str, Any]]
SEEDS = range(4)
LAYOUTS = {
    "with fedavg": [("fedavg", ""), ("fetchsgd", "cols27"), ("fetchsgd", "cols100"), ("true_topk", "k20")],
    "fedavg swept": [("fedavg", "lr3"), ("fedavg", "lr20"), ("fetchsgd", "")],
    "no fedavg": [("fetchsgd", "cols27"), ("local_topk", ""), ("true_topk", "k20")],
}
"""Run groups in the order a report lists them: by strategy, then sweep point with numbers as numbers."""


def _label(strategy: str, point: str) -> str:
    return f"{strategy} {point}" if point else strategy


def _experiment(
    root: Path, seed: int, layout: str, decimals: int = 2
) -> tuple[dict[str, list[Rows]], dict[str, list[str]]]:
    """Run folders as ``runlog.run_dir`` lays them out, 1 to 3 seeds a group, written in reverse.

    Accuracies wander (two decimals by default, so ties happen), cumulative bytes grow from a random scale;
    seeds are stopped early at random. Returns each group's rows by seed and its stopped seeds' notes.
    """
    rng = np.random.default_rng(seed)
    rows: dict[str, list[Rows]] = {}
    notes: dict[str, list[str]] = {}
    for strategy, point in reversed(LAYOUTS[layout]):
        label, base = _label(strategy, point), root / strategy / point if point else root / strategy
        scale, count = 10 ** rng.uniform(3, 9), int(rng.integers(1, 4))
        for k in reversed(range(count)):
            n = int(rng.integers(1, 6))
            up, down = (scale * np.cumsum(rng.uniform(1, 20, size=n)) for _ in range(2))
            seed_rows = [
                {
                    "round": 2 * (i + 1),
                    "strategy": strategy,
                    "seed": k,
                    "test_accuracy": round(float(rng.choice([0.25, 0.5, 0.75]) + 0.25 * rng.random()), decimals),
                    "cum_upload_bytes": int(up[i]),
                    "cum_download_bytes": int(down[i]),
                    "cum_dense_upload_bytes": int(up[i] * rng.uniform(1, 100)),
                }
                for i in range(n)
            ]
            folder = base / f"seed{k}" if k else base
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in seed_rows))
            if rng.random() < 0.35:
                runlog.write_status(folder, "interrupted", "SIGINT", 40)
                notes.setdefault(label, []).append(f"seed {k} interrupted (SIGINT) after round {2 * n} of 40")
            rows.setdefault(label, []).insert(0, seed_rows)
    order = [_label(*group) for group in LAYOUTS[layout]]
    return {label: rows[label] for label in order}, {label: sorted(n) for label, n in notes.items()}


def _spread(values: list[float]) -> tuple[float, float, float]:
    return float(np.mean(values)), min(values), max(values)


def _first(rows: Rows, target: float) -> dict[str, Any] | None:
    """Brute force: the first evaluated round at or above ``target``."""
    hits = [r for r in rows if r["test_accuracy"] >= target]
    return hits[0] if hits else None


def _reference(rows: dict[str, list[Rows]]) -> str | None:
    return next((label for label in rows if label.split()[0] == "fedavg"), None)


def _targets(rows: dict[str, list[Rows]], seed: int) -> list[float]:
    """One accuracy some seeds reach, and 1.0, which none does."""
    reached = sorted({r["test_accuracy"] for seeds in rows.values() for s in seeds for r in s})
    return [reached[len(reached) * (2 + seed % 4) // 7], 1.0]


def _total(row: dict[str, Any]) -> int:
    return row["cum_upload_bytes"] + row["cum_download_bytes"]


def _check_spread(cells: dict[str, str], column: str, values: list[Any]) -> None:
    """A mean to the last digit a float keeps; min and max exactly as the rows hold them."""
    mean, low, high = _spread(values)
    assert float(cells[f"{column}_mean"]) == pytest.approx(mean, rel=1e-12, abs=0), column
    assert (cells[f"{column}_min"], cells[f"{column}_max"]) == (str(low), str(high)), column


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_csv_holds_each_groups_exact_numbers_as_the_rows_say(tmp_path: Path, seed: int, layout: str) -> None:
    rows, notes = _experiment(tmp_path / "exp", seed, layout)
    targets = _targets(rows, seed)
    report, _ = write_report(tmp_path / "exp", targets)
    text = (tmp_path / "exp" / "report.csv").read_text(encoding="utf-8")
    assert text == to_csv(report) and text.endswith("\n") and "\r" not in text
    header, *table = list(csv.reader(text.splitlines()))
    ref = _reference(rows)
    spreads = ["final_accuracy", "upload_bytes", "download_bytes", "upload_compression"]
    want_header = ["run", "strategy", "sweep_point", "seeds", "rounds"]
    want_header += [f"{name}_{stat}" for name in spreads for stat in ("mean", "min", "max")]
    want_header += [f"total_compression_vs_{ref or 'fedavg'}", "pareto_front", "stopped"]
    for t in targets:
        want_header += [
            f"{kind}_bytes_to_{t:g}_{stat}" for kind in ("upload", "total") for stat in ("mean", "min", "max")
        ]
        want_header.append(f"seeds_reaching_{t:g}")
    assert header == want_header
    assert [line[0] for line in table] == list(rows)
    front = run_folders.front(run_folders.finals(rows))
    ref_total = np.mean([_total(s[-1]) for s in rows[ref]]) if ref else None
    for line, (label, seeds) in zip(table, rows.items(), strict=True):
        cells = dict(zip(header, line, strict=True))
        last = [s[-1] for s in seeds]
        strategy, _, point = label.partition(" ")
        assert [cells[c] for c in ("strategy", "sweep_point", "seeds")] == [strategy, point, str(len(seeds))]
        assert cells["rounds"] == str(min(r["round"] for r in last))  # the fewest any seed reached
        _check_spread(cells, "final_accuracy", [r["test_accuracy"] for r in last])
        _check_spread(cells, "upload_bytes", [r["cum_upload_bytes"] for r in last])
        _check_spread(cells, "download_bytes", [r["cum_download_bytes"] for r in last])
        _check_spread(cells, "upload_compression", [r["cum_dense_upload_bytes"] / r["cum_upload_bytes"] for r in last])
        compression = cells[f"total_compression_vs_{ref or 'fedavg'}"]
        if ref_total is None:
            assert compression == ""
        else:
            assert float(compression) == pytest.approx(ref_total / np.mean([_total(r) for r in last]), rel=1e-12)
        assert cells["pareto_front"] == str(label in front)
        assert cells["stopped"] == "; ".join(notes.get(label, []))
        for t in targets:
            hits = [_first(s, t) for s in seeds]
            assert cells[f"seeds_reaching_{t:g}"] == str(sum(h is not None for h in hits))
            got = [h for h in hits if h is not None]
            for kind, of in (("upload", lambda r: r["cum_upload_bytes"]), ("total", _total)):
                if len(got) == len(seeds):
                    _check_spread(cells, f"{kind}_bytes_to_{t:g}", [of(h) for h in got])
                else:  # a group reaches a target only when every seed does
                    assert [cells[f"{kind}_bytes_to_{t:g}_{stat}"] for stat in ("mean", "min", "max")] == [""] * 3


def _cell(mean: float, low: float, high: float, fmt: Any) -> str:
    return fmt(mean) if low == high else f"{fmt(mean)} ({fmt(low)}-{fmt(high)})"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_markdown_table_shows_each_groups_numbers_in_readable_units(tmp_path: Path, seed: int, layout: str) -> None:
    rows, notes = _experiment(tmp_path / "exp", seed, layout)
    targets = _targets(rows, seed)
    report, markdown = write_report(tmp_path / "exp", targets)
    assert (tmp_path / "exp" / "report.md").read_text(encoding="utf-8") == markdown == to_markdown(report)
    lines = markdown.splitlines()
    ref = _reference(rows)
    header = ["run", "seeds", "rounds", "final accuracy", "upload", "download", "upload compression"]
    header.append(f"total compression vs {ref or 'fedavg'}")
    for t in targets:
        header += [f"upload to {t:g}", f"up+down to {t:g}"]
    start = lines.index("| " + " | ".join(header) + " |")
    assert lines[start + 1] == "|" + "---|" * len(header)
    table = [line[2:-2].split(" | ") for line in lines[start + 2 : start + 2 + len(rows)]]
    assert lines[start + 2 + len(rows)] == ""
    front = run_folders.front(run_folders.finals(rows))
    ref_total = np.mean([_total(s[-1]) for s in rows[ref]]) if ref else None
    for cells, (label, seeds) in zip(table, rows.items(), strict=True):
        last = [s[-1] for s in seeds]
        name = label + (" (stopped early)" if label in notes else "") + (" *" if label in front else "")
        totals = [_total(r) for r in last]
        want = [
            name,
            str(len(seeds)),
            _cell(*_spread([r["round"] for r in last]), "{:.0f}".format),
            _cell(*_spread([r["test_accuracy"] for r in last]), "{:.4f}".format),
            _cell(*_spread([r["cum_upload_bytes"] for r in last]), format_bytes),
            _cell(*_spread([r["cum_download_bytes"] for r in last]), format_bytes),
            _cell(*_spread([r["cum_dense_upload_bytes"] / r["cum_upload_bytes"] for r in last]), "{:.1f}x".format),
            "" if ref_total is None else f"{ref_total / np.mean(totals):.1f}x",
        ]
        for t in targets:
            hits = [_first(s, t) for s in seeds]
            got = [h for h in hits if h is not None]
            missed = f"not reached ({len(got)}/{len(seeds)} seeds)"
            if len(got) < len(seeds):
                want += [missed, missed]
            else:
                want.append(_cell(*_spread([h["cum_upload_bytes"] for h in got]), format_bytes))
                want.append(_cell(*_spread([_total(h) for h in got]), format_bytes))
        assert cells == want, label


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_markdown_says_how_to_read_it_who_stopped_the_verdict_and_the_front(
    tmp_path: Path, seed: int, layout: str
) -> None:
    rows, notes = _experiment(tmp_path / "exp", seed, layout)
    targets = _targets(rows, seed)
    report = build_report(tmp_path / "exp", targets)
    markdown = to_markdown(report)
    ref = _reference(rows)
    total = f"{ref}'s upload + download bytes over the run's" if ref else "no fedavg run to compare with"
    intro = [
        "# exp",
        "",
        "One row per strategy and sweep point; with several seeds, mean (min-max). Bytes are totals over the run;",
        "`*` marks the Pareto front of final accuracy against upload bytes.",
        f"Upload compression: dense float32 upload bytes over the bytes uploaded. Total compression: {total}.",
        f"Target accuracy {targets[0]:g}, 1: given on the command line. Bytes to a target are those spent until the first",
        "evaluated round that reached it; a run group reaches it only if every seed does.",
        "",
    ]
    assert markdown.splitlines()[: len(intro)] == intro
    after = markdown.split("\n\n", 3)[3]  # what follows the table
    stopped = [f"- {label}: {note}" for label in rows for note in notes.get(label, [])]
    if stopped:
        head = ["## Stopped before their last round", "", "Their rows above are from the last round they reached."]
        assert after.startswith("\n".join([*head, "", *stopped, "", ""]))
    else:
        assert "Stopped" not in markdown
    finals = run_folders.finals(rows)
    front = run_folders.front(finals)
    verdict = compare(collect_groups(tmp_path / "exp")).sentence()
    assert markdown.endswith(
        "\n".join(
            [
                "",
                "## At equal total bytes",
                "",
                verdict,
                "",
                "## Pareto front: final accuracy vs total upload bytes",
                "",
                "No other run group has at least its accuracy for at most its upload bytes (and is better in one).",
                "",
                *(
                    f"{i}. {label}: {format_bytes(finals[label][0])} uploaded, final accuracy {finals[label][1]:.4f}"
                    for i, label in enumerate(front, 1)
                ),
            ]
        )
        + "\n"
    )
    assert (report.verdict, report.front, report.reference) == (verdict, tuple(front), ref)
    assert [row.on_front for row in report.rows] == [label in front for label in rows]
    assert (report.experiment, report.targets, report.target_note) == (
        "exp",
        tuple(targets),
        "given on the command line",
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_without_a_target_the_report_takes_90_percent_of_the_best_mean_final_accuracy(
    tmp_path: Path, seed: int
) -> None:
    rows, _ = _experiment(tmp_path / "exp", seed, list(LAYOUTS)[seed % len(LAYOUTS)], decimals=6)
    finals = run_folders.finals(rows)
    best = max(finals, key=lambda label: finals[label][1])  # the first listed on a tie
    target = round(0.9 * finals[best][1], 4)  # to four decimals, as shown
    assert target != 0.9 * finals[best][1]
    report = build_report(tmp_path / "exp")
    note = f"90% of the best final accuracy ({best}, {finals[best][1]:.4f})"
    assert (report.targets, report.target_note) == ((target,), note)
    assert f"\nTarget accuracy {target:g}: {note}. Bytes to a target" in to_markdown(report)
    for row, seeds in zip(report.rows, rows.values(), strict=True):
        (got,) = row.reaches
        assert (got.target, got.seeds_reached) == (target, sum(_first(s, target) is not None for s in seeds))


def test_groups_that_tie_on_the_best_accuracy_take_the_first_listed_for_the_default_target(tmp_path: Path) -> None:
    for strategy in ("fedavg", "fetchsgd"):
        (tmp_path / strategy).mkdir()
        row = {"round": 1, "strategy": strategy, "seed": 0, "test_accuracy": 0.5, "cum_upload_bytes": 10}
        row |= {"cum_download_bytes": 10, "cum_dense_upload_bytes": 40}
        (tmp_path / strategy / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    assert build_report(tmp_path).target_note == "90% of the best final accuracy (fedavg, 0.5000)"


@pytest.mark.parametrize("targets", [[0.0], [-0.25], [1.0001], [0.5, 2.0, 0.0], [float("nan")]])
def test_a_target_outside_zero_to_one_is_refused_by_value(tmp_path: Path, targets: list[float]) -> None:
    _experiment(tmp_path, 0, "with fedavg")
    bad = [t for t in targets if not 0.0 < t <= 1.0]
    with pytest.raises(ValueError, match=rf"^target accuracies must be in \(0, 1\], got {re.escape(str(bad))}$"):
        write_report(tmp_path, targets)
    assert not (tmp_path / "report.md").exists() and not (tmp_path / "report.csv").exists()


@pytest.mark.parametrize("targets", [[1.0], [1e-9], [0.5, 1.0]])
def test_a_target_in_zero_to_one_inclusive_of_one_is_taken(tmp_path: Path, targets: list[float]) -> None:
    _experiment(tmp_path, 0, "with fedavg")
    assert build_report(tmp_path, targets).targets == tuple(targets)


def test_an_empty_folder_has_no_report(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="^no metrics.jsonl under "):
        write_report(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_report_files_are_utf_8_under_any_locale(tmp_path: Path) -> None:
    """A strategy or a stop's cause named in any script is written as UTF-8 by a process under an ASCII locale."""
    exp = tmp_path / "exp"
    for strategy, folder in (("fedavg", exp / "fedavg"), ("stratégie", exp / "custom" / "k20")):
        folder.mkdir(parents=True)
        row = {"round": 2, "strategy": strategy, "seed": 0, "test_accuracy": 0.5, "cum_upload_bytes": 10}
        row |= {"cum_download_bytes": 10, "cum_dense_upload_bytes": 40}
        (folder / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    runlog.write_status(exp / "fedavg", "interrupted", "arrêt demandé", 4)
    report, markdown = write_report(exp)
    assert "stratégie k20 *" in markdown and "(arrêt demandé)" in to_csv(report)
    here = {name: (exp / name).read_bytes() for name in ("report.md", "report.csv")}
    assert here == {"report.md": markdown.encode(), "report.csv": to_csv(report).encode()}
    for name in here:
        (exp / name).unlink()
    root = Path(experiments.__file__).resolve().parents[1]  # the code under test, wherever it was imported from
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONPATH": str(root)}
    code = "import sys; from pathlib import Path; from experiments.analysis.report import write_report; "
    code += "write_report(Path(sys.argv[1]))"
    run = subprocess.run([sys.executable, "-c", code, str(exp)], check=False, cwd=root, env=env, capture_output=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert {name: (exp / name).read_bytes() for name in here} == here
