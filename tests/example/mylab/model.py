"""A small convolutional network for 8x8 grayscale digits, built the way fedsketch asks for."""

from __future__ import annotations

from torch import nn


def build(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """fedsketch calls this in every process with the data's sample shape, its classes and the run seed.

    It runs under ``torch.manual_seed(seed)`` already, so plain ``nn`` layers are deterministic in the seed.
    """
    channels, height, width = input_shape
    return nn.Sequential(
        nn.Conv2d(channels, 8, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * height * width, 32),
        nn.ReLU(),
        nn.Linear(32, num_classes),
    )
