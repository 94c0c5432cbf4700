"""Identity (no compression): a bit-exact round trip on buffers of its own; a payload that does not fit, named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsketch.compress import identity


def test_identity_round_trip_is_bit_identical_and_owns_its_buffers() -> None:
    x = torch.tensor([1e-30, -3.5, float("inf"), 7.0], dtype=torch.float32)
    payload = identity.compress(x)
    assert set(payload) == {"update"}
    assert payload["update"].dtype == np.float32
    out = identity.decompress(payload, 4)
    assert out.dtype == torch.float32
    assert torch.equal(out, x)
    payload["update"][0] = 99.0  # the decoded tensor is a copy of the payload
    assert out[0].item() == pytest.approx(1e-30)
    x[1] = 42.0  # and the payload is a copy of the input
    assert payload["update"][1] == -3.5


def test_identity_names_itself_when_the_payload_does_not_match() -> None:
    payload = identity.compress(torch.zeros(3))
    with pytest.raises(ValueError, match=r"^none payload 'update' is float32\[3\]; expected float32\[4\]"):
        identity.decompress(payload, 4)
    with pytest.raises(ValueError, match=r"^none payload has no 'update' array; keys: \['x'\]"):
        identity.decompress({"x": np.zeros(3, np.float32)}, 3)
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0"):
        identity.decompress(payload, 0)
