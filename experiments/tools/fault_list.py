"""The faults :mod:`experiments.tools.fault_injection` injects: one exact text substitution each, and the tests
that must then fail (FetchSGD, Rothchild et al., ICML 2020; Sketched-SGD, Ivkin et al., NeurIPS 2019).

A snippet that no longer matches exactly once is an error (``tests/test_fault_injection.py``), so a
refactor that moves code is told to update this list.
"""

from __future__ import annotations

from dataclasses import dataclass


class FaultListError(ValueError):
    """A fault's snippet does not match the code exactly once: the list needs updating."""


@dataclass(frozen=True)
class Fault:
    """Replace ``old`` by ``new`` in ``path`` (relative to the repository); ``tests`` must then fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str = ""


def _fault(name: str, path: str, old: str, new: str, tests: str, what: str) -> Fault:
    return Fault(name, path, old, new, tuple(tests.split()), what)


ROUND = "tests/test_round_math.py"
EXACT = "tests/test_client_state_exact.py"
STEP = "tests/test_fetchsgd.py"
PATHS = "tests/test_sketch_paths.py tests/test_sketch.py"
FAULTS: tuple[Fault, ...] = (
    # ---- strategy level: what a round does to the model and to the byte counters
    _fault(
        "a-fetchsgd-uniform-merge",
        "fedsketch/methods/fetchsgd.py",
        "examples = [u.num_examples for u in rnd.updates]",
        "examples = [1 for u in rnd.updates]",
        ROUND,
        "FetchSGD merges client tables with uniform, not example, weights",
    ),
    _fault(
        "b-sketched-no-lr",
        "fedsketch/methods/sketched_sgd.py",
        "= rnd.lr * vals.to(delta.device)",
        "= vals.to(delta.device)",
        ROUND,
        "Sketched-SGD's server step without its learning rate",
    ),
    _fault(
        "c-sketched-sum",
        "fedsketch/methods/sketched_sgd.py",
        'exact = weighted_mean([a.payload["val"] for a in answered], [examples[a.cid] for a in answered], exact)',
        'exact = sum(torch.from_numpy(a.payload["val"]) for a in answered)',
        ROUND,
        "Sketched-SGD sums the exact values instead of averaging them",
    ),
    _fault(
        "d-exchange-download",
        "strategies/billing.py",
        "* len(wanted))",
        "* 0)",
        ROUND,
        "the second exchange's download is not counted",
    ),
    _fault(
        "e-exchange-upload",
        "strategies/strategy.py",
        "records.count_replies(self.books, got)\n        return got.updates",
        "records.count_failures(self.books, got)\n        return got.updates",
        ROUND,
        "the second exchange's upload is not counted",
    ),
    _fault(
        "local-sgd-no-weight-decay",
        "fedsketch/local.py",
        "p.add_(p.grad + weight_decay * p, alpha=-lr)",
        "p.add_(p.grad, alpha=-lr)",
        "tests/test_local.py",
        "a client's local SGD steps drop the weight decay",
    ),
    _fault(
        "delta-written-into-the-wrong-tensor",
        "fedsketch/local.py",
        "torch.sub(weights.to(end.dtype), end, out=end)",
        "torch.sub(weights.to(end.dtype), end, out=weights)",
        "tests/test_local.py",
        "a client's update overwrites the global weights it started from",
    ),
    _fault(
        "pickup-waits-as-long-as-flowers",
        "clients/runtime/simulation_backend.py",
        "PICKUP_S_PER_NODE = 0.005",
        "PICKUP_S_PER_NODE = 0.05",
        "tests/test_simulation_backend.py",
        "the in-process engine picks up a round's messages only every 0.1 s, as Flower's own loop does",
    ),
    _fault(
        "values-checked-by-their-maximum-only",
        "strategies/replies.py",
        "largest = max(abs(float(arr.min())), abs(float(arr.max())))",
        "largest = abs(float(arr.max()))",
        "tests/test_array_encoding.py",
        "a reply's array whose largest magnitude is negative passes the server's bound",
    ),
    _fault(
        "npy-header-unpadded",
        "clients/messages.py",
        'data = b"".join((header.getvalue(), arr.reshape(-1).view(np.uint8).data))',
        'data = b"".join((header.getvalue().rstrip(b" \\n") + b"\\n", arr.reshape(-1).view(np.uint8).data))',
        "tests/test_array_encoding.py",
        "a reply's arrays are encoded with a header np.save would not write (bytes counted differently)",
    ),
    _fault(
        "replies-read-through-flowers-views",
        "strategies/replies.py",
        "configs, array_records, metric_records = found.configs, found.arrays, found.metrics",
        "configs, array_records, metric_records = content.config_records, content.array_records, "
        "content.metric_records",
        "tests/test_records.py",
        "the server reads replies through Flower's typed views, whose reference cycles keep a round's replies alive",
    ),
    _fault(
        "wire-chunks-not-deduplicated",
        "clients/messages.py",
        "for i in range(0, len(data), MAX_CHUNK)], len, operator.eq)",
        "for i in range(0, len(data), MAX_CHUNK)], len, lambda a, b: False)",
        "tests/test_wire_bytes.py",
        "identical chunks of an array are counted twice, though Flower sends them once",
    ),
    _fault(
        "wire-header-digits",
        "clients/messages.py",
        "+ len(str(body)) + len(HEAD_BODY_DIVIDER)",
        "+ len(HEAD_BODY_DIVIDER)",
        "tests/test_wire_bytes.py",
        "an object's header is counted without its body length",
    ),
    _fault(
        "metrics-bytes-uncounted",
        "strategies/replies.py",
        "nbytes = wire_bytes(arrays) + wire_bytes(metrics)",
        "nbytes = wire_bytes(arrays)",
        ROUND,
        "a reply's metrics record is left out of its upload bytes",
    ),
    _fault(
        "config-bytes-uncounted",
        "strategies/billing.py",
        'books.add("download", (dense + config_bytes) * plan.sampled())',
        'books.add("download", dense * plan.sampled())',
        ROUND,
        "the round's config is left out of the first exchange's download",
    ),
    # ---- the sketch
    _fault(
        "f-window-off-by-one",
        "fedsketch/_hashing.py",
        "m = C if wide else min(C, cols - start)",
        "m = C if wide else min(C, cols - start - 1)",
        PATHS,
        "off-by-one where a window wraps in the direct path (cols > 4 * 2**15, several chunks)",
    ),
    _fault(
        "g-rows-share-signs",
        "fedsketch/_hashing.py",
        "odd = polynomial_hash(self.coeffs[4:], hi) % 2",
        "odd = polynomial_hash(self.coeffs[4:, :1], hi).expand(self.rows, -1) % 2",
        PATHS,
        "every row uses row 0's chunk signs",
    ),
    _fault(
        "h-topk-bar-too-high",
        "fedsketch/sketch.py",
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
        "tests/test_fetchsgd.py::test_subtract_variant_conserves_mass_in_sketch_space",
        "FetchSGD applies the first k coordinates, not the top k (mass still conserved)",
    ),
    _fault(
        "sketched-top-k-signed",
        "fedsketch/algorithms/sketched_sgd.py",
        "top = torch.topk(exact.abs(), min(params.k, exact.numel()), sorted=False).indices",
        "top = torch.topk(exact, min(params.k, exact.numel()), sorted=False).indices",
        "tests/test_sketched_sgd.py::test_error_accumulation_conserves_mass_over_rounds",
        "Sketched-SGD ranks the exact sums by signed value, not magnitude (mass still conserved)",
    ),
    _fault(
        "true-topk-signed",
        "fedsketch/algorithms/topk_sgd.py",
        "support = torch.topk(error.abs(), params.k, sorted=False).indices",
        "support = torch.topk(error, params.k, sorted=False).indices",
        "tests/test_topk_sgd.py::test_true_topk_conserves_mass",
        "true top-k ranks by signed value, not magnitude (mass still conserved)",
    ),
    # ---- client state, downloads, PowerSGD, the one weighted mean
    _fault(
        "applied-never-marked",
        "strategies/strategy.py",
        "self.books.applied.update(dict.fromkeys(used, server_round))",
        "pass",
        EXACT,
        "the server never tells a client its upload was applied",
    ),
    _fault(
        "settle-ignores-server",
        "fedsketch/client_state.py",
        "if applied is not None and pending_round(stored) == applied:",
        "if pending_round(stored) is not None:",
        EXACT,
        "a client commits its pending state whether or not the server applied its upload",
    ),
    _fault(
        "catch-up-misses-a-round",
        "fedsketch/download.py",
        "idx = torch.nonzero(ledger.changed_at >= since).flatten()",
        "idx = torch.nonzero(ledger.changed_at > since).flatten()",
        "tests/test_download.py",
        "a catch-up leaves out the coordinates changed in the round the client last synced",
    ),
    _fault(
        "powersgd-unorthogonalized",
        "fedsketch/algorithms/powersgd.py",
        "parts = [orthogonalize(f) for f in _factors(flat, p, side)]",
        "parts = _factors(flat, p, side)",
        "tests/test_powersgd.py",
        "PowerSGD's P and Q are used without orthogonalization",
    ),
    _fault(
        "powersgd-error-dropped",
        "fedsketch/methods/powersgd.py",
        '{"error": powersgd.residual(target, p_hat, q, p)}',
        '{"error": torch.zeros_like(target)}',
        "tests/test_powersgd.py",
        "PowerSGD clients drop what their factors did not carry",
    ),
    _fault(
        "weighted-mean-unweighted",
        "fedsketch/aggregate.py",
        "out += (w / total) * x.to(out.device)",
        "out += x.to(out.device) / len(arrays)",
        ROUND,
        "the one weighted mean ignores the example counts",
    ),
    _fault(
        "fidelity-recall-counts-zeros",
        "fedsketch/algorithms/fidelity.py",
        "support = support[error[support] != 0]",
        "support = support",
        "tests/test_sketch_fidelity.py",
        "the diagnostic's recall counts zeros of a sparse error as part of the true top-k",
    ),
    _fault(
        "backend-shares-the-message",
        "clients/runtime/simulation_backend.py",
        "self.app(message=delivered(message), context=context)",
        "self.app(message=message, context=context)",
        "tests/test_simulation_backend.py",
        "the in-process backend hands the sender's own message to the ClientApp",
    ),
    _fault(
        "threads-share-a-model",
        "fedsketch/cohort.py",
        '_THREAD.__dict__.setdefault("models", {})',
        'globals().setdefault("_SHARED", {})',
        "tests/test_simulation_backend.py",
        "every thread of the simulation process trains on one scratch model",
    ),
)
