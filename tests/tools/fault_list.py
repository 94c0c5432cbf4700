"""The faults :mod:`tests.tools.fault_injection` injects: one exact text substitution each, and the tests
that must then fail (FetchSGD, Rothchild et al., ICML 2020; Sketched-SGD, Ivkin et al., NeurIPS 2019).

A snippet that no longer matches exactly once is an error (``tests/tools/test_fault_injection.py``), so a
refactor that moves code is told to update this list.
"""

from __future__ import annotations

from tests.tools.fault import MOMENTUM, ROUND, Fault
from tests.tools.fault import fault as _fault
from tests.tools.fault_list_math import MATH_FAULTS

FAULTS: tuple[Fault, ...] = (
    # ---- strategy level: what a round does to the model and to the byte counters
    _fault(
        "a-fetchsgd-uniform-merge",
        "fedsketch/methods/fetchsgd.py",
        "[u.num_examples for u in rnd.updates], like=sketched.error",
        "[1 for u in rnd.updates], like=sketched.error",
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
        "config_bytes_per_client(config)) * len(wanted)",
        "config_bytes_per_client(config)) * 0",
        ROUND,
        "the second exchange's download is not counted",
    ),
    _fault(
        "e-exchange-upload",
        "strategies/strategy.py",
        "self.values = self.values.book(records.reply_counts(got))\n        return got.updates",
        "self.values = self.values.book(records.failure_counts(got))\n        return got.updates",
        ROUND,
        "the second exchange's upload is not counted",
    ),
    _fault(
        "local-sgd-no-weight-decay",
        "fedsketch/training/local.py",
        "p.add_(p.grad + weight_decay * p, alpha=-lr)",
        "p.add_(p.grad, alpha=-lr)",
        "tests/fedsketch/training/test_local.py",
        "a client's local SGD steps drop the weight decay",
    ),
    _fault(
        "delta-written-into-the-wrong-tensor",
        "fedsketch/training/local.py",
        "torch.sub(weights.to(end.dtype), end, out=end)",
        "torch.sub(weights.to(end.dtype), end, out=weights)",
        "tests/fedsketch/training/test_local.py",
        "a client's update overwrites the global weights it started from",
    ),
    _fault(
        "momentum-buffer-outlives-its-client",
        "fedsketch/training/local.py",
        "buffers: list[torch.Tensor | None] = [None] * len(list(model.parameters()))",
        'buffers: list[torch.Tensor | None] = local_update.__dict__.setdefault("kept", [None] * len(list(model.parameters())))',
        MOMENTUM,
        "a client's local momentum starts from the buffer the previous client left",
    ),
    _fault(
        "momentum-before-weight-decay",
        "fedsketch/training/local.py",
        "    b = g if buf is None else torch.add(buf * spec.momentum, g)\n    return torch.add(p, b, alpha=-spec.lr), b",
        "    b = grad if buf is None else torch.add(buf * spec.momentum, grad)\n"
        "    return torch.add(p, b + spec.weight_decay * p, alpha=-spec.lr), b",
        MOMENTUM,
        "local momentum accumulates the raw gradient and the weight decay is added after it",
    ),
    _fault(
        "momentum-first-step-scaled",
        "fedsketch/training/local.py",
        "b = g if buf is None else",
        "b = (1 - spec.momentum) * g if buf is None else",
        MOMENTUM,
        "local momentum's first step scales the gradient (an average, not torch's b = g)",
    ),
    _fault(
        "momentum-zero-not-the-plain-floats",
        "fedsketch/training/local.py",
        "p.add_(p.grad + weight_decay * p, alpha=-lr)",
        "p.add_(p.grad.add(p, alpha=weight_decay), alpha=-lr)",
        MOMENTUM,
        "momentum 0 with weight decay computes other floats than plain SGD did",
    ),
    _fault(
        "vectorized-momentum-one-buffer",
        "fedsketch/training/batched.py",
        "buffers = {name: b for name, (_, b) in stepped.items()}",
        "buffers = {name: b.mean(0, keepdim=True) for name, (_, b) in stepped.items()}",
        MOMENTUM,
        "the vectorized clients share one momentum buffer (their mean)",
    ),
    _fault(
        "vectorized-momentum-ignored",
        "fedsketch/training/batched.py",
        "        if spec.momentum:\n            stepped",
        "        if not spec.momentum:\n            stepped",
        MOMENTUM,
        "the vectorized local steps run plain SGD whatever client-momentum says",
    ),
    _fault(
        "pickup-waits-as-long-as-flowers",
        "bridge/runtime/simulation_backend.py",
        "PICKUP_S_PER_NODE = 0.005",
        "PICKUP_S_PER_NODE = 0.05",
        "tests/bridge/runtime/test_simulation_backend.py",
        "the in-process engine picks up a round's messages only every 0.1 s, as Flower's own loop does",
    ),
    _fault(
        "values-checked-by-their-maximum-only",
        "fedsketch/client/uploads.py",
        "largest = max(abs(float(low)), abs(float(high)))",
        "largest = abs(float(high))",
        "tests/bridge/test_messages_arrays.py",
        "a reply's array whose largest magnitude is negative passes the server's bound",
    ),
    _fault(
        "npy-header-unpadded",
        "bridge/messages.py",
        "    return header.getvalue()",
        '    return header.getvalue().rstrip(b" \\n") + b"\\n"',
        "tests/bridge/test_messages_arrays.py",
        "a reply's arrays are encoded with a header np.save would not write (bytes counted differently)",
    ),
    _fault(
        "replies-read-through-flowers-views",
        "strategies/replies.py",
        "configs, metric_records = found.configs, found.metrics",
        "configs, metric_records = content.config_records, content.metric_records",
        "tests/bridge/test_messages_records.py",
        "the server reads replies through Flower's typed views, whose reference cycles keep a round's replies alive",
    ),
    _fault(
        "replies-keep-read-arrays",
        "strategies/replies.py",
        "    content.pop(key, None)\n    return found.arrays.pop(key, None)",
        "    return found.arrays.pop(key, None)",
        "tests/bridge/test_messages_records.py",
        "the server leaves each client's arrays in its reply after decoding a copy: a dense round's bytes twice",
    ),
    _fault(
        "wire-chunks-not-deduplicated",
        "bridge/messages.py",
        "index, chunks = _distinct(pieces, lambda c: len(c[0]) + len(c[1]), _same_bytes)",
        "index, chunks = _distinct(pieces, lambda c: len(c[0]) + len(c[1]), lambda a, b: False)",
        "tests/bridge/test_messages_wire_bytes.py",
        "identical chunks of an array are counted twice, though Flower sends them once",
    ),
    _fault(
        "wire-header-digits",
        "bridge/messages.py",
        "+ len(str(body)) + len(HEAD_BODY_DIVIDER)",
        "+ len(HEAD_BODY_DIVIDER)",
        "tests/bridge/test_messages_wire_bytes.py",
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
        'return Counter({"download": (dense + config_bytes) * plan.sampled()})',
        'return Counter({"download": dense * plan.sampled()})',
        ROUND,
        "the round's config is left out of the first exchange's download",
    ),
    *MATH_FAULTS,
)
