"""Error feedback conserves mass: nothing is lost, only delayed; the carry is exactly what was not sent.

The carry is checked to the bit against float64 on small dyadic inputs (docs/mutation.md, "compress" section).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from fedsketch.compress import compress_with_feedback, get_compressor, identity, topk
from tests.fedsketch.compress.test_topk import X, reference_topk

ROUNDS = 25
D = 300


def updates(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(D, generator=gen) * (1 + r % 3) for r in range(ROUNDS)]


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("topk", {"k": 10}),
        ("signsgd", {}),
        ("gaussiank", {"k": 10}),
        ("qsgd", {"s": 2}),
        ("random_k", {"k": 5}),
    ],
)
def test_sent_plus_final_error_equals_sum_of_updates(name: str, options: dict[str, object]) -> None:
    comp = get_compressor(name, D, **options)
    error: torch.Tensor | None = None
    sent = torch.zeros(D, dtype=torch.float64)
    total = torch.zeros(D, dtype=torch.float64)
    for r, update in enumerate(updates(seed=1)):
        payload, error = compress_with_feedback(
            update,
            error,
            partial(comp.compress, seed=r),
            partial(comp.decompress, seed=r),
        )
        sent += comp.decompress(payload, seed=r).double()
        total += update.double()
    assert error is not None
    # Float32 rounding is relative to the largest magnitude in play (the error
    # itself grows large under unbiased but non-contractive QSGD).
    scale = max(float(t.abs().max()) for t in (total, sent, error))
    torch.testing.assert_close(sent + error.double(), total, rtol=0, atol=1e-5 * scale)


def test_first_round_error_is_what_was_not_sent() -> None:
    x = torch.tensor([5.0, -1.0, 0.5, -7.0])
    payload, error = compress_with_feedback(x, None, partial(topk.compress, k=2), partial(topk.decompress, d=4))
    torch.testing.assert_close(error, torch.tensor([0.0, -1.0, 0.5, 0.0]))
    torch.testing.assert_close(topk.decompress(payload, 4), torch.tensor([5.0, 0.0, 0.0, -7.0]))


def test_error_feedback_eventually_sends_small_coordinates() -> None:
    """Top-k alone never sends coordinate 0 of a constant update; with feedback it does."""
    x = torch.tensor([0.1, 1.0, 1.0, 1.0])
    error: torch.Tensor | None = None
    sent = torch.zeros(4)
    for _ in range(40):
        payload, error = compress_with_feedback(x, error, partial(topk.compress, k=3), partial(topk.decompress, d=4))
        sent += topk.decompress(payload, 4)
    assert sent[0] > 0


def test_rejects_an_error_of_another_shape() -> None:
    with pytest.raises(ValueError, match=r"error has shape \(3,\); update has \(4,\)"):
        compress_with_feedback(
            torch.zeros(4),
            torch.zeros(3),
            partial(topk.compress, k=1),
            partial(topk.decompress, d=4),
        )


# exactly what was not sent ----------------------------------------------------------------------------------


def test_feedback_carries_exactly_what_was_not_sent() -> None:
    """sent + new carry == update + old carry, to the bit in float64 (dyadic inputs sum exactly)."""
    error = torch.tensor([0.25, 1.0, -0.5, 4.0, 0.0, -2.0, 0.0625], dtype=torch.float64)
    payload, new_error = compress_with_feedback(X, error, partial(topk.compress, k=3), partial(topk.decompress, d=7))
    assert new_error.dtype == torch.float32  # a float64 carry is brought to float32
    sent = topk.decompress(payload, 7).double()
    target = X.double() + error
    assert torch.equal(sent + new_error.double(), target)
    assert set(torch.nonzero(sent).reshape(-1).tolist()) == reference_topk(target.float(), 3)
    assert torch.equal(new_error.double(), torch.where(sent == 0, target, torch.zeros_like(target)))


def test_feedback_with_no_carry_compresses_the_update_itself() -> None:
    payload, new_error = compress_with_feedback(X, None, identity.compress, partial(identity.decompress, d=7))
    assert torch.equal(torch.from_numpy(payload["update"]), X)
    assert torch.equal(new_error, torch.zeros(7))


def test_feedback_keeps_the_carry_on_the_updates_device() -> None:
    """An update on another device (meta, which holds no data) than the CPU carry and the CPU decoder's answer."""
    update = torch.zeros(7, device="meta")
    payload, new_error = compress_with_feedback(update, torch.ones(7), lambda t: {}, lambda p: torch.zeros(7))
    assert payload == {}
    assert new_error.device.type == "meta" and new_error.shape == (7,) and new_error.dtype == torch.float32


def test_feedback_refuses_a_carry_of_another_shape_but_takes_the_same_shape() -> None:
    comp, dec = partial(topk.compress, k=1), partial(topk.decompress, d=4)
    with pytest.raises(ValueError, match=r"^error has shape \(2, 2\); update has \(4,\)$"):
        compress_with_feedback(torch.ones(4), torch.zeros(2, 2), comp, dec)
    _, new_error = compress_with_feedback(torch.ones(4), torch.zeros(4), comp, dec)
    assert new_error.sum().item() == 3.0
