"""Methods compared at equal total bytes, and the verdict in one sentence.

The FetchSGD paper (Rothchild et al., ICML 2020, Sec. 6) compares methods by
accuracy against bytes communicated. Two readings at *equal total bytes*
(upload + download), each fair to a method that stops spending early:

- accuracy at the *budget*: the smallest whole-run total of any seed of any
  run group, so every run is read at a spend it reached; a run's accuracy there
  is that of its last evaluated round within the budget;
- bytes to the *target* (90% of the best mean final accuracy, the report's
  default), reached only if every seed reaches it.

``fedsketch run`` and ``fedsketch report`` print :meth:`Comparison.sentence`;
the participation map (:mod:`experiments.studies.participation`) applies it per cell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from experiments.analysis.results import DEFAULT_TARGET_FRACTION, Row, RunGroup, Spread, format_bytes, reach, summarize

FOCUS = "fetchsgd"
"""The method a sentence places against the leader when it does not lead itself."""


@dataclass(frozen=True)
class Entry:
    """One run group, over its seeds."""

    name: str
    strategy: str
    seeds: int
    final: Spread
    """Final test accuracy."""
    total: Spread
    """Whole-run upload + download bytes."""
    at_budget: Spread
    """Accuracy at the comparison's budget."""
    to_target: Spread | None
    """Upload + download bytes to the target; ``None`` unless every seed reached it."""


@dataclass(frozen=True)
class Comparison:
    """Every run group of an experiment (or of one map cell) at the same budget and target."""

    budget: float
    target: float
    entries: tuple[Entry, ...]

    def best_at_budget(self) -> Entry:
        """The entry with the highest mean accuracy at the budget (the first listed on a tie)."""
        return max(self.entries, key=lambda e: e.at_budget.mean)

    def fewest_to_target(self) -> Entry | None:
        """The entry that reaches the target on the fewest mean bytes (``None`` if none does)."""
        reached = [(e.to_target.mean, i) for i, e in enumerate(self.entries) if e.to_target is not None]
        return self.entries[min(reached)[1]] if reached else None

    def separated(self) -> bool:
        """Whether the leader at the budget is ahead of every other entry on every seed (bands apart)."""
        return not self.level_with_leader()

    def level_with_leader(self) -> list[Entry]:
        """The entries the leader at the budget is not ahead of on every seed: their seed bands overlap its band
        (with one seed each, their accuracy equals its)."""
        best = self.best_at_budget()
        return [e for e in self.entries if e is not best and not best.at_budget.low > e.at_budget.high]

    def margin(self) -> str:
        """`` (tied with fedavg)`` with one seed each, `` (seed bands overlap with fedavg's)`` with more; or ``''``
        where the leader is ahead on every seed."""
        level = self.level_with_leader()
        if not level:
            return ""
        names = ", ".join(e.name for e in level)
        if all(e.seeds == 1 for e in (self.best_at_budget(), *level)):
            return f" (tied with {names})"
        return f" (seed bands overlap with {names}'s)" if len(level) == 1 else f" (seed bands overlap with {names})"

    def sentence(self) -> str:
        """The verdict: who leads at the budget and who reaches the target on the fewest bytes, each against
        FetchSGD, or against the runner-up where FetchSGD is the one ahead."""
        best, fastest = self.best_at_budget(), self.fewest_to_target()
        words = [f"At equal total bytes ({format_bytes(self.budget)} up + down, the smallest run's spend)"]
        words.append(f"{best.name} leads with {best.at_budget.mean:.4f}")
        others = [e for e in self.entries if e is not best]
        rival = self._focus(others) or max(others, key=lambda e: e.at_budget.mean, default=None)
        if rival is not None:
            words.append(f"against {rival.name}'s {rival.at_budget.mean:.4f}")
        line = " ".join(words) + self.margin() + "; "
        if fastest is None:
            return line + f"no method reaches {self.target:.4f} (90% of the best final) on every seed."
        line += f"{fastest.name} reaches {self.target:.4f} (90% of the best final) on the fewest bytes"
        line += f" ({format_bytes(fastest.to_target.mean if fastest.to_target else 0)}"
        others = [e for e in self.entries if e is not fastest]
        reached = [e for e in others if e.to_target is not None]
        rival = self._focus(others) or min(reached, key=lambda e: e.to_target.mean if e.to_target else 0, default=None)
        if rival is not None:
            line += f"; {rival.name}: {format_bytes(rival.to_target.mean) if rival.to_target else 'not reached'}"
        elif others:
            line += "; no other method reaches it"
        return line + ")."

    @staticmethod
    def _focus(entries: Sequence[Entry]) -> Entry | None:
        """FetchSGD's entry among ``entries``, if it is there."""
        return next((e for e in entries if e.strategy == FOCUS), None)


def accuracy_at(rows: Sequence[Row], budget: float) -> float:
    """Accuracy of the last evaluated round whose cumulative upload + download is within ``budget`` (0 if none)."""
    within = [r for r in rows if r["cum_upload_bytes"] + r["cum_download_bytes"] <= budget]
    return float(within[-1]["test_accuracy"]) if within else 0.0


def compare(groups: Sequence[RunGroup], names: Mapping[str, str] | None = None) -> Comparison:
    """Measure every group at one budget and target; ``names`` gives display names by group label.

    Raises
    ------
    ValueError
        If ``groups`` is empty.
    """
    if not groups:
        raise ValueError("nothing to compare: no run groups")
    summaries = [summarize(g) for g in groups]
    budget = min(s.total.low for s in summaries)
    target = DEFAULT_TARGET_FRACTION * max(s.accuracy.mean for s in summaries)
    return Comparison(
        budget,
        target,
        tuple(
            Entry(
                name=(names or {}).get(s.group.label, s.group.label),
                strategy=s.group.strategy,
                seeds=len(s.group.seeds),
                final=s.accuracy,
                total=s.total,
                at_budget=Spread.of([accuracy_at(rows, budget) for rows in s.group.seeds]),
                to_target=reach(s, target).total,
            )
            for s in summaries
        ),
    )
