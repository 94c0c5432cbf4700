"""Bytes per client per round for every method of an experiment, measured on one real round.

Each method runs one round of the experiment (its model, data and settings)
through the real strategy and the real ClientApp in this process
(:func:`experiments.running.forecast.first_round`): what a client uploads in every exchange and
what it is sent are the serialized records the run would bill, counted by the
same code. The arrays column is what one client's first upload holds. The
exact byte count of each layout is checked against its formula in
``tests/fedsketch/methods/test_compressed.py``.

    python -m experiments.bench.payload_bytes                                   # experiments/configs/baselines.toml
    python -m experiments.bench.payload_bytes experiments/configs/default.toml
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import torch

from experiments.running.forecast import first_round
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, Payload, get_method


def first_upload(cfg: RunConfig, d: int) -> Payload:
    """What one client uploads first for a Gaussian update of length ``d`` (with the round's requests)."""
    method = get_method(cfg.strategy)
    request = method.server.requests(method.server.init(cfg, d, torch.device("cpu")), [0], cfg, d).get(0, {})
    update = torch.randn(d, generator=torch.Generator().manual_seed(0))
    return method.client.encode(update, ClientJob(0, 1, method.wire.round_config(cfg), {}, request), cfg)[0]


def measure(cfg: RunConfig) -> tuple[float, float, Payload]:
    """One round of ``cfg``: mean upload and download bytes per sampled client, and one client's first upload."""
    first = first_round(RunConfig.from_mapping({"download": "dense"}, base=cfg))
    if first.contributed == 0:
        raise SystemExit(f"{cfg.strategy}: no client contributed to the measured round")
    return first.upload / first.contributed, first.download / first.sampled, first_upload(cfg, first.d)


def main() -> None:
    """Print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="experiments/configs/baselines.toml")
    args = parser.parse_args()
    doc = tomllib.loads(Path(args.config).read_text())
    base = RunConfig.from_mapping(doc["run"])
    names = list(doc.get("compare", {}).get("strategies", [base.strategy]))
    runs = {n: RunConfig.from_mapping({"strategy": n, **doc.get("strategy", {}).get(n, {})}, base=base) for n in names}
    dense_up, _, _ = measure(RunConfig.from_mapping({"strategy": "fedavg"}, base=base))
    print("Measured on one round (dense download); every exchange counted, metrics records included.\n")
    print("| method | first upload's arrays | upload / client / round | download / client / round | vs dense up |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, cfg in runs.items():
        up, down, payload = measure(cfg)
        arrays = ", ".join(f"{k} {arr.dtype}[{arr.size:,}]" for k, arr in payload.items())
        second = " (+ a second exchange)" if get_method(name).client.answer is not None else ""
        print(f"| {name} | {arrays}{second} | {up:,.0f} | {down:,.0f} | {dense_up / up:.1f}x |")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
