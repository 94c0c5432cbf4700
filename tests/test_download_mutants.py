"""The download ledger's edges: its input checks and messages, and float32 on the wire whatever the model's dtype.

Each test pins a behaviour of :mod:`fedsketch.server.download` that the end-to-end download tests pass
through without checking (docs/mutation.md, third module).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsketch.compress.sparse import decode_sparse_pairs
from fedsketch.server import download


def _ledger_with_two_rounds() -> tuple[download.DownloadLedger, torch.Tensor]:
    """d = 6; round 1 changes coordinates 1 and 4, round 2 coordinate 2; client 3 synced in round 2."""
    ledger = download.new_ledger(6)
    w0 = torch.zeros(6, dtype=torch.float64)
    w1 = w0.clone()
    w1[[1, 4]] = torch.tensor([0.1, -2.5], dtype=torch.float64)
    ledger, _ = download.record_update(ledger, 1, w0, w1)
    w2 = w1.clone()
    w2[2] = 1.0 / 3.0
    ledger, _ = download.record_update(ledger, 2, w1, w2)
    ledger = download.mark_synced(ledger, [3], 2)
    return ledger, w2


def test_a_one_parameter_model_has_a_ledger_and_an_empty_one_is_refused_by_name() -> None:
    ledger = download.new_ledger(1)
    assert ledger.changed_at.tolist() == [0] and ledger.changed_at.dtype == torch.int32
    after, changed = download.record_update(ledger, 5, torch.zeros(1), torch.ones(1))
    assert changed == 1 and after.changed_at.tolist() == [5]
    assert ledger.changed_at.tolist() == [0]  # a value: the ledger it was given is as it was
    for d in (0, -3):
        with pytest.raises(ValueError, match=rf"^model size d must be > 0; got {d}$"):
            download.new_ledger(d)


@pytest.mark.parametrize(("before", "after"), [(5, 4), (4, 5), (5, 5)])
def test_weights_of_either_wrong_shape_are_refused_and_the_ledger_is_left_as_it_was(before: int, after: int) -> None:
    ledger = download.new_ledger(4)
    with pytest.raises(ValueError, match=rf"^weights of shape \({before},\) and \({after},\); the ledger has d=4$"):
        download.record_update(ledger, 1, torch.zeros(before), torch.ones(after))
    assert ledger.changed_at.tolist() == [0, 0, 0, 0]


def test_syncing_and_forgetting_give_new_ledgers_and_leave_the_given_one_as_it_was() -> None:
    ledger, _ = _ledger_with_two_rounds()
    synced = download.mark_synced(ledger, [4, 5], 3)
    forgotten = download.forget(synced, [3, 4])
    assert dict(ledger.synced) == {3: 2}
    assert dict(synced.synced) == {3: 2, 4: 3, 5: 3}
    assert dict(forgotten.synced) == {3: download.FORGOTTEN, 4: download.FORGOTTEN, 5: 3}
    assert forgotten.changed_at is ledger.changed_at  # what no round changed is shared, not copied


def test_a_client_that_holds_no_model_has_no_catch_up_values_and_the_error_names_it() -> None:
    ledger, weights = _ledger_with_two_rounds()
    with pytest.raises(ValueError, match=r"^client 9 holds no model: it is sent the dense one$"):
        download.catch_up_values(ledger, 9, weights, False)
    ledger = download.forget(ledger, [3])
    with pytest.raises(ValueError, match=r"^client 3 holds no model: it is sent the dense one$"):
        download.catch_up_values(ledger, 3, weights, True)
    with pytest.raises(ValueError, match=r"^client None holds no model: it is sent the dense one$"):
        download.catch_up_values(ledger, None, weights, False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_catch_up_values_are_float32_whatever_the_models_dtype(dtype: torch.dtype) -> None:
    ledger, w2 = _ledger_with_two_rounds()
    weights = w2.to(dtype)
    want = weights.to(torch.float32)
    got = download.catch_up_values(ledger, 3, weights, False)  # synced in round 2: coordinate 2
    assert got.dtype == np.float32 and got.tolist() == [want[2].item()]
    from_init = download.catch_up_values(ledger, 7, weights, True)  # never synced, holds round 1's model
    assert from_init.dtype == np.float32 and from_init.tolist() == want[[1, 2, 4]].tolist()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_catch_up_sends_float32_values_whatever_the_models_dtype(dtype: torch.dtype) -> None:
    ledger, w2 = _ledger_with_two_rounds()
    weights = w2.to(dtype)
    payload = download.catch_up(ledger, 7, 3, weights, from_init=True)
    assert payload is not None
    idx, val = decode_sparse_pairs(payload, 6)
    assert idx.tolist() == [1, 2, 4] and val.dtype == torch.float32
    assert val.tolist() == weights.to(torch.float32)[[1, 2, 4]].tolist()
    assert np.array_equal(download.catch_up_values(ledger, 7, weights, True), val.numpy())


def test_apply_catch_up_returns_a_new_float32_model_from_a_float64_one() -> None:
    ledger, w2 = _ledger_with_two_rounds()
    payload = download.catch_up(ledger, 3, 3, w2)
    assert payload is not None
    kept = np.array([0.0, 0.1, 0.0, 7.0, -2.5, 1e-40], dtype=np.float64)  # a float64 copy of round 2's model
    out = download.apply_catch_up(kept, payload)
    assert out.dtype == np.float32 and out is not kept
    want = np.array([0.0, 0.1, 1.0 / 3.0, 7.0, -2.5, 1e-40], dtype=np.float32)
    np.testing.assert_array_equal(out, want)
    assert kept[2] == 0.0  # the kept model is not written to
