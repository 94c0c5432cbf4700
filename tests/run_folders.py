"""Finished run folders written by hand, for the readers of experiment results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

MB = 1_000_000


def write_seed(folder: Path, strategy: str, seed: int, points: list[tuple[int, int, float]]) -> None:
    """A finished seed: one metrics row per ``(upload MB, download MB, accuracy)``, cumulative, rounds 5, 10, ..."""
    folder.mkdir(parents=True)
    rows = [
        {
            "round": 5 * (i + 1),
            "strategy": strategy,
            "seed": seed,
            "test_accuracy": acc,
            "cum_upload_bytes": up * MB,
            "cum_download_bytes": down * MB,
            "cum_dense_upload_bytes": 10 * up * MB,
        }
        for i, (up, down, acc) in enumerate(points)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def two_methods(root: Path) -> Path:
    """FetchSGD spends more and ends higher; stateless local top-k is ahead at the budget."""
    for seed, shift in ((0, 0.0), (1, 0.02)):
        write_seed(
            root / "fetchsgd" / f"seed{seed}",
            "fetchsgd",
            seed,
            [(50, 50, 0.3 + shift), (100, 100, 0.5 + shift), (150, 150, 0.9 + shift)],
        )
        write_seed(
            root / "local_topk" / "errornone" / f"seed{seed}",
            "local_topk",
            seed,
            [(1, 60, 0.6 + shift), (2, 120, 0.7 + shift)],
        )
    return root


def finals(groups: dict[str, list[list[dict[str, Any]]]]) -> dict[str, tuple[float, float]]:
    """Each group's (mean final upload bytes, mean final accuracy), from its seeds' metrics rows."""
    return {
        label: (
            float(np.mean([rows[-1]["cum_upload_bytes"] for rows in seeds])),
            float(np.mean([rows[-1]["test_accuracy"] for rows in seeds])),
        )
        for label, seeds in groups.items()
    }


def front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Brute force: the labels no other point beats on one and matches on the other, by increasing bytes."""
    kept = [
        a
        for a, (ba, ya) in points.items()
        if not any(bb <= ba and yb >= ya and (bb, yb) != (ba, ya) for bb, yb in points.values())
    ]
    return sorted(kept, key=lambda a: (points[a][0], -points[a][1]))
