"""Server-side evaluation (``fedsketch/server/evaluate.py``), by what the model scores.

The accuracy is the share of examples whose largest logit is their label and the loss the mean
cross-entropy, whatever the batch size, whatever mode the model was left in (a model with dropout
and batch norm scores as in eval mode), and without touching the model's gradients.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedsketch.server.evaluate import evaluate

N, FEATURES, CLASSES = 37, 6, 4


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, FEATURES, generator=gen), torch.randint(0, CLASSES, (N,), generator=gen)


def noisy_model() -> nn.Module:
    """A model whose training mode changes its output: dropout, and batch norm's batch statistics."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, CLASSES)
    )
    with torch.no_grad():  # running statistics unlike any batch's, so batch norm in train mode would differ
        model[1].running_mean.fill_(0.7)
        model[1].running_var.fill_(3.0)
    return model


def expected(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The definition, over the whole set at once, in eval mode."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
    return int((logits.argmax(dim=1) == y).sum()) / len(y), float(F.cross_entropy(logits, y))


@pytest.mark.parametrize("batch_size", [1, 5, N - 1, N, 1024])
def test_accuracy_and_loss_are_the_definitions_whatever_the_batch_size(batch_size: int) -> None:
    x, y = data()
    model = noisy_model()
    want_acc, want_loss = expected(model, x, y)
    acc, loss = evaluate(model.train(), x, y, batch_size=batch_size)
    assert acc == pytest.approx(want_acc, abs=1e-12)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert 0 < acc < 1  # neither bound: a wrong count would show


def test_a_model_left_in_training_mode_scores_as_in_eval_mode_every_time() -> None:
    x, y = data(1)
    model = noisy_model()
    want = expected(model, x, y)
    scores = {evaluate(model.train(), x, y, batch_size=8) for _ in range(3)}
    assert len(scores) == 1
    acc, loss = scores.pop()
    assert acc == pytest.approx(want[0], abs=1e-12) and loss == pytest.approx(want[1], rel=1e-5)
    assert not model.training


def test_a_known_answer_three_of_seven_right() -> None:
    model = nn.Linear(CLASSES, CLASSES, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(CLASSES))  # logits are the inputs
    x = torch.eye(CLASSES)[[0, 1, 2, 3, 0, 1, 2]] * 2.0
    y = torch.tensor([0, 1, 2, 0, 1, 2, 3])  # the first three right
    acc, loss = evaluate(model, x, y, batch_size=3)
    assert acc == 3 / 7
    right = -torch.log_softmax(torch.tensor([2.0, 0.0, 0.0, 0.0]), dim=0)
    assert loss == pytest.approx((3 * float(right[0]) + 4 * float(right[1])) / 7, rel=1e-6)


def test_evaluation_computes_no_gradients() -> None:
    x, y = data()
    model = noisy_model()
    evaluate(model, x, y)
    assert all(p.grad is None for p in model.parameters())


def test_an_empty_test_set_is_refused() -> None:
    with pytest.raises(ValueError, match="^empty test set$"):
        evaluate(noisy_model(), torch.zeros(0, FEATURES), torch.zeros(0, dtype=torch.long))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_model_scores_a_test_set_kept_on_the_cpu_as_on_the_cpu() -> None:
    x, y = data(2)
    model = noisy_model()
    want_acc, want_loss = expected(model, x, y)
    acc, loss = evaluate(model.to("cuda").train(), x, y, batch_size=8)
    assert acc == pytest.approx(want_acc, abs=1e-12) and loss == pytest.approx(want_loss, rel=1e-4)
