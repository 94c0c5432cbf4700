"""Where a sampled run's time went: py-spy's raw stacks summed by the parts of a round.

``py-spy record -s -f raw -r RATE -o FILE -- python -m experiments.bench.bench_paper ...`` writes one line per
distinct stack, ``frame;frame;... count``; this prints, for each part of a round named in :data:`PARTS`,
the seconds its stacks were sampled (a thread waiting on a lock or queue is sampled too, so parts
on different threads overlap in time), then the functions of fedsketch's own packages and every
function's own samples, waits left out.

    python -m experiments.bench.profile_split FILE [--rate 40] [--top 25]

experiments/bench/gpu_check.sh runs it on the GPU run's profile (``PROFILE=1``).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

PARTS = (
    ("server: build and bill the requests", "FedSketchStrategy.configure_train"),
    ("server: wait for the replies", "send_and_receive (strategies/waiting.py"),
    ("server: read and check the replies", "collect (strategies/replies.py"),
    ("server: the method's step", "server_step ("),
    ("server: finiteness checks", "all_finite ("),
    ("server: the download ledger", "record_update ("),
    ("server: evaluation and the round's row", "FedSketchStrategy.log_row"),
    ("node: read the request and the model", "weights_for ("),
    ("node: the clients' gradients", "_vectorized_results ("),
    ("node: sketch and encode", "_finish ("),
    ("node: the reply's records", "add_update ("),
    ("node: all of the ClientApp", "train (clients/client_app.py"),
    ("Flower: hand replies to the link state", "put_message_into_state"),
)
WAITS = ("Condition.wait", "Event.wait", "Queue.get", "sleep", "select", "_wait_for_tstate_lock", "poll (")
OWN = re.compile(r"\((fedsketch|strategies|clients|experiments)/")


def stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    """Each line's frames (line numbers dropped, so a function counts once) and its sample count."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")], int(count)


def tally(path: Path) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    """Samples by part, by own function (inclusive) and by innermost function, and the total."""
    parts: Counter[str] = Counter()
    own: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    total = 0
    for frames, n in stacks(path):
        total += n
        joined = ";".join(frames)
        for label, needle in PARTS:
            if needle in joined:
                parts[label] += n
        for f in dict.fromkeys(f for f in frames if OWN.search(f)):
            own[f] += n
        if not any(w in frames[-1] for w in WAITS):
            innermost[frames[-1]] += n
    return parts, own, innermost, total


def main(argv: list[str] | None = None) -> None:
    """Print the three tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--rate", type=float, default=40.0, help="py-spy's samples a second (-r)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    parts, own, innermost, total = tally(args.file)
    print(f"{total:,} samples at {args.rate:g} a second: {total / args.rate:.1f} thread-seconds\n")
    print("| part of a round | seconds sampled |\n| --- | ---: |")
    for label, _ in PARTS:
        print(f"| {label} | {parts[label] / args.rate:.1f} |")
    print("\n| fedsketch's functions (inclusive) | seconds |\n| --- | ---: |")
    for name, n in own.most_common(args.top):
        print(f"| {name[:120]} | {n / args.rate:.1f} |")
    print("\n| innermost function (waits left out) | seconds |\n| --- | ---: |")
    for name, n in innermost.most_common(args.top):
        print(f"| {name[:120]} | {n / args.rate:.1f} |")


if __name__ == "__main__":
    main()
