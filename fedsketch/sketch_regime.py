"""Whether a run's Count Sketch can recover its k coordinates, and what the regime map says of its shape.

FetchSGD (Rothchild et al., ICML 2020) and Sketched-SGD (Ivkin et al., NeurIPS
2019) recover the k largest coordinates of a vector from its Count Sketch. Each
row hashes the coordinates into ``sketch-cols`` buckets; with fewer buckets than
k, the k coordinates share buckets in every row (more than one a bucket on
average), and the Count Sketch's guarantee for finding heavy coordinates needs
columns in proportion to their number (Charikar, Chen and Farach-Colton, ICALP
2002). Such a run is refused before anything starts (:func:`refuse`).

Above that floor, docs/regime.md measured FetchSGD against true top-k on dense
models: within 5 points at 10 columns per k with k = 1% of d
(:data:`COLS_PER_K`, the plan's note), and from 8.7 to 32.3 points behind at
the narrowest sketches it measured, about 35 model coordinates a counter
(:data:`MAP_COORDINATES_PER_COUNTER`). A FetchSGD run beyond that ratio gets a
warning with its numbers (:func:`shape_warnings`): the map has nothing to say there,
and at its edge the sketch already cost a third of the accuracy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedsketch.settings.declared import DECLARATIONS
from fedsketch.settings.setting import ConfigError

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

COLS_PER_K = 10
"""docs/regime.md: the fewest sketch columns per k at which FetchSGD came within 5 points of true top-k on the
dense models it measured (2.7-4.8 points at k = 1% of d; 6.2-12.6 behind at 3 per k)."""
MAP_COORDINATES_PER_COUNTER = 35
"""docs/regime.md: the most model coordinates per sketch counter (d / (rows x cols)) the map measured (34.7, the
CNN's 3 x 16,000 sketch); at about 33-35 FetchSGD trailed true top-k by :data:`MAP_GAPS` points."""
MAP_GAPS = (8.7, 32.3)
"""The range of FetchSGD's gaps to true top-k, in points, at the map's narrowest sketches (all three models, both k)."""
COLS_NOTE = (
    "{label}: cols/k = {ratio:.1f} is below the {need} columns per k at which the regime map found FetchSGD within "
    "5 points of true top-k on dense models (k = 1% of d; 6.2-12.6 points behind at 3 per k), and even at 100 per k "
    "its sketch found at most 11% of the true top-k there; see docs/regime.md"
)


def sketches(cfg: RunConfig) -> bool:
    """Whether the run's method recovers k coordinates from a Count Sketch of ``sketch-cols`` columns."""
    method = DECLARATIONS[cfg.strategy]
    return method.reads("sketch-cols") and method.reads("k")


def refuse(cfg: RunConfig) -> None:
    """Refuse a sketch with fewer columns than the coordinates it must recover.

    Raises
    ------
    ConfigError
        Naming both settings and their values.
    """
    if sketches(cfg) and cfg.sketch_cols < cfg.k:
        raise ConfigError(
            f"settings 'sketch-cols' ({cfg.sketch_cols:,}) and 'k' ({cfg.k:,}) do not fit: {cfg.strategy} recovers "
            f"k coordinates from a Count Sketch, and {cfg.sketch_cols:,} columns a row cannot hold {cfg.k:,} "
            f"coordinates apart; set 'sketch-cols' to at least 'k' (docs/regime.md: {COLS_PER_K} x k at k = 1% of d)"
        )


def shape_warnings(cfg: RunConfig, d: int, label: str) -> list[str]:
    """What the regime map says against a FetchSGD run's sketch at model size ``d``, in numbers; ``[]`` if nothing."""
    if cfg.strategy != "fetchsgd":  # the map measured FetchSGD
        return []
    counters = cfg.sketch_rows * cfg.sketch_cols
    per_counter = d / counters
    if per_counter <= MAP_COORDINATES_PER_COUNTER:
        return []
    line = (
        f"{label}: a {cfg.sketch_rows} x {cfg.sketch_cols:,} sketch is {counters:,} counters for d = {d:,} "
        f"coordinates, {per_counter:,.0f} coordinates a counter; the regime map (docs/regime.md) measured up to "
        f"{MAP_COORDINATES_PER_COUNTER}, where FetchSGD already trailed true top-k by {MAP_GAPS[0]}-{MAP_GAPS[1]} "
        "points: widen the sketch ('sketch-cols') or expect worse"
    )
    return [line]


def cols_note(cfg: RunConfig, label: str) -> str | None:
    """The regime map's word on a FetchSGD run below :data:`COLS_PER_K` columns per k; ``None`` otherwise."""
    if cfg.strategy != "fetchsgd" or cfg.sketch_cols >= COLS_PER_K * cfg.k:
        return None
    return COLS_NOTE.format(label=label, ratio=cfg.sketch_cols / cfg.k, need=COLS_PER_K)
