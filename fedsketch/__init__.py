"""fedsketch: federated learning with Count Sketches (FetchSGD) and its baselines.

The core library: the Count Sketch, compressors, server-side algorithms as
explicit state transitions, data, models and byte-exact payloads. It never
imports Flower; ``strategies/`` and ``clients/`` do the Flower plumbing.

References: Rothchild et al., "FetchSGD: Communication-Efficient Federated
Learning with Sketching", ICML 2020; Ivkin et al., "Communication-efficient
Distributed SGD with Sketching", NeurIPS 2019.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsketch.config import ConfigError, RunConfig
    from fedsketch.sketch.count_sketch import CountSketch

__all__ = ["ConfigError", "CountSketch", "RunConfig"]
__version__ = "0.1.0"
_HOMES = {
    "ConfigError": "fedsketch.settings.setting",
    "RunConfig": "fedsketch.config",
    "CountSketch": "fedsketch.sketch.count_sketch",
}


def __getattr__(name: str) -> Any:
    """The package's names, imported when first asked for: ``fedsketch.server.runlog`` and the CLI's
    watching half need no torch (docs/simulation.md, "Memory")."""
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'fedsketch' has no attribute {name!r}")
