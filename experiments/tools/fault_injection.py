"""Fault injection: break the math on purpose, and check that the fast tests notice.

A test that cannot fail is a defect. Each fault below is one exact text
substitution in one file (a dropped learning rate, uniform instead of example
weights, an off-by-one in the sketch's direct window path, ...), the kind of
slip that leaves FetchSGD (Rothchild et al., ICML 2020) or Sketched-SGD (Ivkin
et al., NeurIPS 2019) running and plausible-looking but wrong. For each, the
script copies the repository's tracked files (as they are in the working tree)
into a temporary folder, applies the fault there, and runs the fast tests named
for it::

    python -m pytest -q -x -m "not slow" <tests>      (PYTHONPATH = the copy)

It prints one line per fault (caught or missed, the first failing test, the
seconds it took) and exits non-zero if any fault is missed. A first line runs
all the named tests on the unmodified copy: they must pass, or "caught" means
nothing. A snippet that no longer matches exactly once is an error, so a
refactor that moves code is told to update this list
(``tests/test_fault_injection.py`` checks that on every fast run).

    python experiments/tools/fault_injection.py               # every fault
    python experiments/tools/fault_injection.py --only f-window-off-by-one b-sketched-lr
    python experiments/tools/fault_injection.py --list
    python experiments/tools/fault_injection.py --every       # no -x: list every test each fault fails
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTEST = ("-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider")
TIMEOUT_S = 900
TIMED_OUT = 124


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
MOMENTUM = "tests/test_client_momentum.py tests/test_batched_local.py"
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
        "momentum-buffer-outlives-its-client",
        "fedsketch/local.py",
        "buffers: list[torch.Tensor | None] = [None] * len(list(model.parameters()))",
        'buffers: list[torch.Tensor | None] = local_update.__dict__.setdefault("kept", [None] * len(list(model.parameters())))',
        MOMENTUM,
        "a client's local momentum starts from the buffer the previous client left",
    ),
    _fault(
        "momentum-before-weight-decay",
        "fedsketch/local.py",
        "    b = g if buf is None else torch.add(buf * spec.momentum, g)\n    return torch.add(p, b, alpha=-spec.lr), b",
        "    b = grad if buf is None else torch.add(buf * spec.momentum, grad)\n"
        "    return torch.add(p, b + spec.weight_decay * p, alpha=-spec.lr), b",
        MOMENTUM,
        "local momentum accumulates the raw gradient and the weight decay is added after it",
    ),
    _fault(
        "momentum-first-step-scaled",
        "fedsketch/local.py",
        "b = g if buf is None else",
        "b = (1 - spec.momentum) * g if buf is None else",
        MOMENTUM,
        "local momentum's first step scales the gradient (an average, not torch's b = g)",
    ),
    _fault(
        "momentum-zero-not-the-plain-floats",
        "fedsketch/local.py",
        "p.add_(p.grad + weight_decay * p, alpha=-lr)",
        "p.add_(p.grad.add(p, alpha=weight_decay), alpha=-lr)",
        MOMENTUM,
        "momentum 0 with weight decay computes other floats than plain SGD did",
    ),
    _fault(
        "vectorized-momentum-one-buffer",
        "fedsketch/batched.py",
        "buffers = {name: b for name, (_, b) in stepped.items()}",
        "buffers = {name: b.mean(0, keepdim=True) for name, (_, b) in stepped.items()}",
        MOMENTUM,
        "the vectorized clients share one momentum buffer (their mean)",
    ),
    _fault(
        "vectorized-momentum-ignored",
        "fedsketch/batched.py",
        "        if spec.momentum:\n            stepped",
        "        if not spec.momentum:\n            stepped",
        MOMENTUM,
        "the vectorized local steps run plain SGD whatever client-momentum says",
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


@dataclass(frozen=True)
class Outcome:
    """What the named tests did on one (faulty or clean) copy."""

    name: str
    verdict: str  # "caught", "missed", "passed" (the clean copy), "FAILED" (the clean copy), "error"
    test: str
    seconds: float


def apply(fault: Fault, root: Path) -> None:
    """Apply ``fault`` to the tree at ``root``; :class:`FaultListError` unless ``old`` occurs exactly once."""
    target = root / fault.path
    if not target.is_file():
        raise FaultListError(f"fault {fault.name}: {fault.path} does not exist")
    text = target.read_text()
    count = text.count(fault.old)
    if count != 1:
        raise FaultListError(
            f"fault {fault.name}: the snippet {fault.old!r} occurs {count} times in {fault.path} (expected once); "
            "update experiments/tools/fault_injection.py to the current code"
        )
    target.write_text(text.replace(fault.old, fault.new))


def check_list(faults: Sequence[Fault], root: Path = ROOT) -> list[str]:
    """Every problem with the list against the code at ``root``: stale snippets, missing test files, duplicates."""
    problems = []
    names = [f.name for f in faults]
    problems += [f"duplicate fault name {n}" for n in sorted({n for n in names if names.count(n) > 1})]
    for fault in faults:
        if fault.old == fault.new:
            problems.append(f"fault {fault.name} changes nothing")
        target = root / fault.path
        count = target.read_text().count(fault.old) if target.is_file() else 0
        if count != 1:
            problems.append(f"fault {fault.name}: snippet occurs {count} times in {fault.path} (expected once)")
        for test in fault.tests:
            if not (root / test.split("::")[0]).is_file():
                problems.append(f"fault {fault.name}: test file {test.split('::')[0]} does not exist")
    return problems


def copy_tracked(src: Path, dst: Path) -> None:
    """Copy the files git tracks under ``src`` (their working-tree contents) to ``dst``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=src, capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        source = src / rel
        if source.is_file():  # tracked but deleted in the working tree: skip
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dst / rel)


def run_tests(tree: Path, tests: Sequence[str], every: bool = False) -> tuple[int, str]:
    """Run the fast tests ``tests`` inside ``tree``; the exit code and the first failing test (all, if ``every``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, *PYTEST, *([] if every else ["-x"]), *tests]
    try:
        done = subprocess.run(
            command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return TIMED_OUT, f"timed out after {TIMEOUT_S} s"
    if done.returncode < 0:  # killed by a signal: a fault can make torch crash (two threads on one model)
        return done.returncode, f"the tests crashed ({signal.Signals(-done.returncode).name})"
    found = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE)
    if found:
        return done.returncode, " ".join(found if every else found[:1])
    tail = done.stdout.strip().splitlines()[-1:] or done.stderr.strip().splitlines()[-1:] or [""]
    return done.returncode, tail[0][:100]


def run_fault(fault: Fault | None, tests: Sequence[str], src: Path = ROOT, every: bool = False) -> Outcome:
    """Copy the repository, apply ``fault`` (none: the clean copy) and run ``tests`` there."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedsketch-fault-") as tmp:
        tree = Path(tmp)
        copy_tracked(src, tree)
        if fault is not None:
            apply(fault, tree)
        code, test = run_tests(tree, tests, every)
    seconds = time.perf_counter() - start
    if fault is None:
        return Outcome("(none: the code as it is)", "passed" if code == 0 else "FAILED", test, seconds)
    # pytest exits 1 when tests failed, and a crash under the fault (a signal) is noticed too; 0 means
    # the fault went unnoticed; anything else (collection error, unknown test id, time-out) is not a
    # test catching the math.
    verdict = "caught" if code == 1 or code < 0 else {0: "missed"}.get(code, "error")
    return Outcome(fault.name, verdict, test if code != 0 else "", seconds)


def table_row(outcome: Outcome, width: int) -> str:
    """One aligned line of the report: fault, result, seconds, first failing test."""
    return f"{outcome.name:<{width}}  {outcome.verdict:<7}  {outcome.seconds:>7.1f}  {outcome.test or '-'}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these faults")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--every", action="store_true", help="run all the named tests and list every failure")
    args = parser.parse_args(argv)
    problems = check_list(FAULTS)
    if problems:
        print("the fault list does not match the code:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    chosen = [f for f in FAULTS if not args.only or f.name in args.only]
    unknown = sorted(set(args.only or ()) - {f.name for f in FAULTS})
    if unknown or not chosen:
        print(f"unknown fault names {unknown}; --list shows them", file=sys.stderr)
        return 2
    if args.list:
        for f in chosen:
            print(f"{f.name:<30} {f.path:<38} {f.what}")
        return 0
    all_tests = list(dict.fromkeys(t for f in chosen for t in f.tests))
    width = max(len("(none: the code as it is)"), *(len(f.name) for f in chosen))
    failing = "failing tests" if args.every else "first failing test"
    print(f"{'fault':<{width}}  {'result':<7}  {'seconds':>7}  {failing}", flush=True)
    outcomes = [run_fault(None, all_tests)]
    print(table_row(outcomes[0], width), flush=True)
    if outcomes[0].verdict != "passed":
        print("the tests fail on the unmodified code: fix that first", file=sys.stderr)
        return 1
    for fault in chosen:
        outcomes.append(run_fault(fault, fault.tests, every=args.every))
        print(table_row(outcomes[-1], width), flush=True)
    missed = [o.name for o in outcomes[1:] if o.verdict != "caught"]
    print(
        f"\n{len(chosen) - len(missed)} of {len(chosen)} faults caught" + (f"; not caught: {missed}" if missed else "")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
