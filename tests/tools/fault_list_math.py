"""The faults in the math: the Count Sketch, FetchSGD's server step, its conservation rule, client state,
downloads, PowerSGD and the one weighted mean (FetchSGD, Rothchild et al., ICML 2020; Sketched-SGD, Ivkin et
al., NeurIPS 2019). Part of :data:`tests.tools.fault_list.FAULTS`.
"""

from __future__ import annotations

from tests.tools.fault import EXACT, PATHS, ROUND, STEP, Fault
from tests.tools.fault import fault as _fault

MATH_FAULTS: tuple[Fault, ...] = (
    # ---- the sketch
    _fault(
        "f-window-off-by-one",
        "fedsketch/sketch/hashing.py",
        "m = C if wide else min(C, cols - start)",
        "m = C if wide else min(C, cols - start - 1)",
        PATHS,
        "off-by-one where a window wraps in the direct path (cols > 4 * 2**15, several chunks)",
    ),
    _fault(
        "g-rows-share-signs",
        "fedsketch/sketch/hashing.py",
        "odd = polynomial_hash(self.coeffs[4:], hi) % 2",
        "odd = polynomial_hash(self.coeffs[4:, :1], hi).expand(self.rows, -1) % 2",
        PATHS,
        "every row uses row 0's chunk signs",
    ),
    _fault(
        "h-topk-bar-too-high",
        "fedsketch/sketch/count_sketch.py",
        "count, trimmed, bar[0] = [idx], [val], k, True, float(kth)",
        "count, trimmed, bar[0] = [idx], [val], k, True, float(kth) * 1.01",
        PATHS,
        "top-k's running candidate threshold 1% above the k-th magnitude",
    ),
    # ---- FetchSGD's server step (lossy sketches, k < d)
    _fault(
        "fetchsgd-error-not-zeroed",
        "fedsketch/algorithms/fetchsgd.py",
        "error = _take_out(error_sketch, indices, values, params.error_feedback)",
        "error = error_sketch.table",
        STEP,
        "FetchSGD's error feedback does not take Delta out of S_e",
    ),
    _fault(
        "fetchsgd-error-not-carried",
        "fedsketch/algorithms/fetchsgd.py",
        "error = state.error + into_error * momentum",
        "error = into_error * momentum",
        STEP,
        "FetchSGD drops the error accumulated in earlier rounds",
    ),
    _fault(
        "fetchsgd-update-lr-dropped",
        "fedsketch/algorithms/fetchsgd.py",
        "applied = values if onto_update == 1.0 else onto_update * values",
        "applied = values",
        STEP,
        "lr-placement = update: the applied update is not scaled by the learning rate",
    ),
    _fault(
        "fetchsgd-no-momentum",
        "fedsketch/algorithms/fetchsgd.py",
        "momentum = params.momentum * state.momentum + merged",
        "momentum = merged",
        STEP,
        "FetchSGD's momentum is not applied",
    ),
    _fault(
        "fetchsgd-momentum-not-zeroed",
        "fedsketch/algorithms/fetchsgd.py",
        "    if params.momentum_zeroing:\n",
        "    if False:\n",
        STEP,
        "FetchSGD never zeroes momentum at Delta's support",
    ),
    # ---- the conservation tests check the selection rule, not only an identity
    _fault(
        "fetchsgd-first-k",
        "fedsketch/algorithms/fetchsgd.py",
        "indices, values = error_sketch.topk(params.k)",
        "indices = torch.arange(params.k); values = error_sketch.estimate(indices)",
        "tests/fedsketch/algorithms/test_fetchsgd.py::test_subtract_variant_conserves_mass_in_sketch_space",
        "FetchSGD applies the first k coordinates, not the top k (mass still conserved)",
    ),
    _fault(
        "sketched-top-k-signed",
        "fedsketch/algorithms/sketched_sgd.py",
        "top = torch.topk(exact.abs(), min(params.k, exact.numel()), sorted=False).indices",
        "top = torch.topk(exact, min(params.k, exact.numel()), sorted=False).indices",
        "tests/fedsketch/algorithms/test_sketched_sgd.py::test_error_accumulation_conserves_mass_over_rounds",
        "Sketched-SGD ranks the exact sums by signed value, not magnitude (mass still conserved)",
    ),
    _fault(
        "true-topk-signed",
        "fedsketch/algorithms/topk_sgd.py",
        "support = torch.topk(error.abs(), params.k, sorted=False).indices",
        "support = torch.topk(error, params.k, sorted=False).indices",
        "tests/fedsketch/algorithms/test_topk_sgd.py::test_true_topk_conserves_mass",
        "true top-k ranks by signed value, not magnitude (mass still conserved)",
    ),
    # ---- client state, downloads, PowerSGD, the one weighted mean
    _fault(
        "applied-never-marked",
        "strategies/strategy.py",
        "self.values = self.values.book(applied={**self.books.applied, **dict.fromkeys(used, server_round)})",
        "pass",
        EXACT,
        "the server never tells a client its upload was applied",
    ),
    _fault(
        "settle-ignores-server",
        "fedsketch/client/state.py",
        "if applied is not None and pending_round(stored) == applied:",
        "if pending_round(stored) is not None:",
        EXACT,
        "a client commits its pending state whether or not the server applied its upload",
    ),
    _fault(
        "catch-up-misses-a-round",
        "strategies/billing.py",
        "idx = torch.nonzero(ledger.changed_at >= since).flatten()",
        "idx = torch.nonzero(ledger.changed_at > since).flatten()",
        "tests/strategies/test_billing_catch_up.py",
        "a catch-up leaves out the coordinates changed in the round the client last synced",
    ),
    _fault(
        "powersgd-unorthogonalized",
        "fedsketch/algorithms/powersgd.py",
        "parts = [orthogonalize(f) for f in _factors(flat, p, side)]",
        "parts = _factors(flat, p, side)",
        "tests/fedsketch/algorithms/test_powersgd.py",
        "PowerSGD's P and Q are used without orthogonalization",
    ),
    _fault(
        "powersgd-error-dropped",
        "fedsketch/methods/powersgd.py",
        '{"error": powersgd.residual(target, p_hat, q, p)}',
        '{"error": torch.zeros_like(target)}',
        "tests/fedsketch/algorithms/test_powersgd.py",
        "PowerSGD clients drop what their factors did not carry",
    ),
    _fault(
        "weighted-mean-unweighted",
        "fedsketch/algorithms/aggregate.py",
        "out += (w / total) * x",
        "out += x / len(arrays)",
        ROUND,
        "the one weighted mean ignores the example counts",
    ),
    _fault(
        "fidelity-recall-counts-zeros",
        "fedsketch/algorithms/fidelity.py",
        "support = support[error[support] != 0]",
        "support = support",
        "tests/fedsketch/algorithms/test_fidelity_diagnostic.py",
        "the diagnostic's recall counts zeros of a sparse error as part of the true top-k",
    ),
    _fault(
        "backend-shares-the-message",
        "bridge/runtime/simulation_backend.py",
        "self.app(message=delivered(message), context=context)",
        "self.app(message=message, context=context)",
        "tests/bridge/runtime/test_simulation_backend.py",
        "the in-process backend hands the sender's own message to the ClientApp",
    ),
    _fault(
        "threads-share-a-model",
        "fedsketch/client/cohort.py",
        '_THREAD.__dict__.setdefault("models", {})',
        'globals().setdefault("_SHARED", {})',
        "tests/bridge/runtime/test_simulation_backend.py",
        "every thread of the simulation process trains on one scratch model",
    ),
)
