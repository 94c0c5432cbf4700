"""Flower processes: a private SuperLink and `flwr run` per run; tracking, measuring, stopping what was started."""
