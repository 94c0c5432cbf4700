"""Upload per client per round for every method: the formula, and what one real payload serializes to.

Each method encodes the same Gaussian update of the experiment's model size
with the experiment's settings (the real client encoder), and the payload's
ArrayRecord is serialized as Flower sends it. The formula column is checked
against the payload's array bytes, so a formula in the README that drifts from
the code fails here.

    python -m experiments.payload_bytes                                   # experiments/configs/baselines.toml
    python -m experiments.payload_bytes experiments/configs/default.toml
"""

from __future__ import annotations

import argparse
import math
import tomllib
from pathlib import Path

import numpy as np
import torch

from fedsketch.client_side import ClientInput, RoundInfo, encode
from fedsketch.config import RunConfig
from fedsketch.task import client_options, load_data, make_model
from strategies.records import client_metrics, payload_to_record, wire_bytes


def formula(cfg: RunConfig, d: int, payload: dict[str, np.ndarray]) -> tuple[str, int]:
    """The upload's array bytes as a formula in the run's settings, and its value."""
    scales = math.ceil(d / cfg.quantizer_bucket_size) if cfg.quantizer_bucket_size else 1
    bits = math.ceil(d / 8)
    name = cfg.strategy
    if name in ("fetchsgd", "sketched_sgd"):
        return "4 rows cols", 4 * cfg.sketch_rows * cfg.sketch_cols
    if name in ("fedavg", "true_topk"):
        return "4 d", 4 * d
    if name in ("local_topk", "gaussiank"):
        sent = payload["val"].size  # Gaussian-k's threshold lands near k, not on it
        return "1 + 4 k + min(4 k, d/8)", 1 + 4 * sent + min(4 * sent, bits)
    if name == "random_k":
        return "4 k (positions from the round's seed)", 4 * cfg.k
    if name == "qsgd":
        level_bits = math.ceil(math.log2(cfg.qsgd_levels + 1))
        return f"4 d/B + d/8 + {level_bits} d/8", 4 * scales + bits + math.ceil(d * level_bits / 8)
    if name == "terngrad":
        return "4 d/B + 2 d/8", 4 * scales + math.ceil(2 * d / 8)
    if cfg.signsgd_variant == "majority":
        return "d/8", bits
    return "4 d/B + d/8", 4 * scales + bits


def main() -> None:
    """Print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="experiments/configs/baselines.toml")
    args = parser.parse_args()
    doc = tomllib.loads(Path(args.config).read_text())
    base = RunConfig.from_mapping(doc["run"])
    d = sum(p.numel() for p in make_model(base, load_data(base)).parameters())
    update = torch.randn(d, generator=torch.Generator().manual_seed(0))
    metrics = wire_bytes(client_metrics(64, 0.5, 0.1))
    print(f"d = {d:,}; B = quantizer-bucket-size; every reply also carries a {metrics}-byte metrics record\n")
    print("| method | arrays | formula (array bytes) | array bytes | serialized record | vs dense |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    dense = wire_bytes(payload_to_record({"update": np.zeros(d, np.float32)}))
    for name in doc.get("compare", {}).get("strategies", [base.strategy]):
        cfg = RunConfig.from_mapping({"strategy": name, **doc.get("strategy", {}).get(name, {})}, base=base)
        info = RoundInfo(1, cfg.seed, cfg.sketch_rows, cfg.sketch_cols)
        payload, _ = encode(client_options(cfg), update, ClientInput(3, info))
        text, value = formula(cfg, d, payload)
        array_bytes = sum(arr.nbytes for arr in payload.values())
        if value != array_bytes:
            raise SystemExit(f"{name}: formula gives {value} bytes, the payload has {array_bytes}")
        record = wire_bytes(payload_to_record(payload))
        arrays = ", ".join(f"{k} {arr.dtype}[{arr.size}]" for k, arr in payload.items())
        if name == "sketched_sgd":
            second = wire_bytes(payload_to_record({"val": np.zeros(cfg.candidate_factor * cfg.k, np.float32)}))
            text += f" + 4 P k = {4 * cfg.candidate_factor * cfg.k:,} in the second exchange"
            record += second
        print(f"| {name} | {arrays} | {text} | {array_bytes:,} | {record:,} | {dense / record:.1f}x |")


if __name__ == "__main__":
    main()
