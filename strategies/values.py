"""The server's whole state between rounds, as one frozen value.

What a run's server holds besides its configuration (Rothchild et al., ICML
2020, keep FetchSGD's momentum and error on the server; here they are the
method's state): the model's flat weights, the method's state, the books
(:class:`fedsketch.server.books.Books`: bytes, failures, the download ledger), the DP
noise generator's state and the last round finished. A round replaces the
value; a checkpoint saves it whole and resuming gives one back
(:mod:`strategies.resume`). The books are a value too: a round's steps return
what they counted, and :meth:`ServerValues.book` adds it into new books.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from fedsketch.methods.method import ServerState
from fedsketch.server.books import Books, Counts


@dataclass(frozen=True)
class ServerValues:
    """Weights, the method's state, books, the DP noise's generator state and the last finished round."""

    weights: torch.Tensor  # the model's flat weights
    state: ServerState  # the method's state
    books: Books  # the run's books
    noise: torch.Tensor  # the DP noise generator's state (``torch.Generator.get_state()``)
    server_round: int = 0  # the last round finished (applied or skipped); 0 before the first

    def book(self, counts: Counts | None = None, **fields: Any) -> ServerValues:
        """These values with new books: ``counts`` added, the named fields of :class:`Books` replaced."""
        return replace(self, books=replace(self.books.add(counts) if counts else self.books, **fields))

    def generator(self) -> torch.Generator:
        """A generator at the saved noise state (draw from it, then keep its new state)."""
        gen = torch.Generator()
        gen.set_state(self.noise)
        return gen
