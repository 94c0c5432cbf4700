"""The product files one round passes through, traced in a real Flower simulation.

docs/architecture.md ("One FetchSGD round, file by file") lists the files a
round of the default job runs; ``tests/tools/test_round_files.py`` checks that list
against this trace. The run goes through :func:`bridge.simulation.simulate`
in this process, as ``fedsketch run`` does in its simulation process, with a
profile hook on every thread that records each Python function called from
the moment the strategy starts round 2 (of three) until it starts the next: the
requests, the clients' work, the replies, the server step, the evaluation and
the metrics row. Start-up and the first round's one-time work (imports, the
data, caches) are outside it.

    python -m tests.tools.round_files                      # the default job's FetchSGD
    python -m tests.tools.round_files --set download=sparse --functions
    python -m tests.tools.round_files --set strategy=fedavg --lines
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from experiments.running.runner import DEFAULT_CONFIG, load_experiment, parse_overrides, run_config_toml
from fedsketch.settings.setting import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PREFIX = f"{ROOT}/"
"""What a product file's code path starts with (the hook tests it on every call it sees)."""
PACKAGES = ("fedsketch/", "strategies/", "clients/", "bridge/", "experiments/")
"""The product's packages, relative to the repository root."""
SMALL = {"num-rounds": 3, "eval-every": 1}
"""Three rounds, every one evaluated: the traced round is an ordinary one, neither the first nor the last."""


class RoundTrace:
    """A profile hook that counts, per product function, the calls made during one round."""

    def __init__(self, server_round: int) -> None:
        from strategies.strategy import FedSketchStrategy

        self.server_round = server_round
        self.start = FedSketchStrategy.run_round.__code__
        self.on = False
        self.calls: Counter[tuple[str, str]] = Counter()
        self.spans: dict[str, set[int]] = {}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code is self.start:  # the round loop's body: round r starts here, and ends when r + 1 does
            self.on = frame.f_locals.get("server_round") == self.server_round
        if self.on and code.co_filename.startswith(PREFIX):
            path = code.co_filename[len(PREFIX) :]
            if path.startswith(PACKAGES) and path != "tests/tools/round_files.py":
                if (path, code.co_qualname) not in self.calls:
                    lines = [line for _, _, line in code.co_lines() if line is not None]
                    self.spans.setdefault(path, set()).update(range(code.co_firstlineno, max(lines, default=0) + 1))
                self.calls[path, code.co_qualname] += 1

    def called_lines(self) -> dict[str, int]:
        """Per file, the lines of the functions the round called (their docstrings included; nested ones once)."""
        return {path: len(lines) for path, lines in sorted(self.spans.items())}

    def files(self) -> dict[str, int]:
        """Each file the round passed through, with how many calls it took."""
        out: Counter[str] = Counter()
        for (path, _), n in self.calls.items():
            out[path] += n
        return dict(sorted(out.items()))


def trace(settings: dict[str, Any], server_round: int = 2, supernodes: int = 2) -> RoundTrace:
    """Run the default job's FetchSGD with ``settings`` on top (and :data:`SMALL`) through Flower; the round's trace."""
    from bridge.simulation import simulate
    from experiments.flower.app_files import clientapp_for

    hook = RoundTrace(server_round)
    with tempfile.TemporaryDirectory(prefix="round-files-") as tmp:
        overrides = {**SMALL, **settings, "out-dir": tmp}
        cfg = load_experiment(DEFAULT_CONFIG, overrides, strategies=[str(settings.get("strategy", "fetchsgd"))]).runs[0]
        run_config = Path(tmp) / "run_config.toml"
        run_config.write_text(run_config_toml(cfg), encoding="utf-8")
        threading.setprofile(hook)
        sys.setprofile(hook)
        try:
            simulate(ROOT, run_config, supernodes, 1, 0.0, clientapp_for("inprocess"))
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    return hook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.round_files", description=__doc__.split("\n")[0])
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings on top of the default job")
    parser.add_argument("--functions", action="store_true", help="also list each function called, with its calls")
    parser.add_argument("--lines", action="store_true", help="also count each file's lines, and those the round called")
    parser.add_argument("--json", action="store_true", help="print {files: {file: calls}, called_lines: {file: n}}")
    args = parser.parse_args(argv)
    try:
        hook = trace(parse_overrides(args.set))
    except ConfigError as exc:
        print(f"round_files: {exc}", file=sys.stderr)
        return 2
    files = hook.files()
    if not files:
        print(f"round_files: the run never started round {hook.server_round} (see Flower's log above)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"files": files, "called_lines": hook.called_lines()}))  # the last line, after Flower's log
        return 0
    called, whole = hook.called_lines(), {path: _line_count(ROOT / path) for path in files}
    for path, n in files.items():
        lines = f", {called[path]} of its {whole[path]} lines in functions called" if args.lines else ""
        print(f"{path}  ({n} calls{lines})")
        if args.functions:
            for (where, name), calls in sorted(hook.calls.items()):
                if where == path:
                    print(f"    {name} x{calls}")
    print(f"{len(files)} files", end="")
    print(f", {sum(whole.values())} lines, {sum(called.values())} of them in functions called" if args.lines else "")
    return 0


def _line_count(path: Path) -> int:
    with path.open(encoding="utf-8") as f:
        return sum(1 for _ in f)


if __name__ == "__main__":
    raise SystemExit(main())
