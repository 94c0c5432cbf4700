"""The download ledger (``fedsketch/server/ledger.py``): what each client has seen, a value each round replaces.

Its input checks and messages, and that syncing and forgetting leave the given ledger as it was; what the
catch-up reads from it: ``tests/strategies/test_billing_catch_up.py``.
"""

from __future__ import annotations

import pytest
import torch

from fedsketch.server.books import Books
from fedsketch.server.ledger import FORGOTTEN, forget, mark_synced, record_update


def test_ledger_rejects_mismatched_weights() -> None:
    ledger = Books.start(4, sparse_download=True).ledger
    with pytest.raises(ValueError, match="ledger has d=4"):
        record_update(ledger, 1, torch.zeros(5), torch.zeros(5))


def test_a_one_parameter_model_has_a_ledger() -> None:
    ledger = Books.start(1, sparse_download=True).ledger
    assert ledger.changed_at.tolist() == [0] and ledger.changed_at.dtype == torch.int32
    after, changed = record_update(ledger, 5, torch.zeros(1), torch.ones(1))
    assert changed == 1 and after.changed_at.tolist() == [5]
    assert ledger.changed_at.tolist() == [0]  # a value: the ledger it was given is as it was


@pytest.mark.parametrize(("before", "after"), [(5, 4), (4, 5), (5, 5)])
def test_weights_of_either_wrong_shape_are_refused_and_the_ledger_is_left_as_it_was(before: int, after: int) -> None:
    ledger = Books.start(4, sparse_download=True).ledger
    with pytest.raises(ValueError, match=rf"^weights of shape \({before},\) and \({after},\); the ledger has d=4$"):
        record_update(ledger, 1, torch.zeros(before), torch.ones(after))
    assert ledger.changed_at.tolist() == [0, 0, 0, 0]


def test_syncing_and_forgetting_give_new_ledgers_and_leave_the_given_one_as_it_was() -> None:
    ledger = mark_synced(Books.start(6, sparse_download=True).ledger, [3], 2)
    synced = mark_synced(ledger, [4, 5], 3)
    forgotten = forget(synced, [3, 4])
    assert dict(ledger.synced) == {3: 2}
    assert dict(synced.synced) == {3: 2, 4: 3, 5: 3}
    assert dict(forgotten.synced) == {3: FORGOTTEN, 4: FORGOTTEN, 5: 3}
    assert forgotten.changed_at is ledger.changed_at  # what no round changed is shared, not copied
