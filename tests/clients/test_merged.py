"""A node's merged reply (``clients/merged.py``), entry by entry: what the server reads of each client.

The end-to-end agreement of merged and per-client rounds is ``tests/fedsketch/client/test_uploads.py``'s;
the server's side of a merged reply is ``tests/strategies/test_replies_merged.py``'s.
"""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from bridge import messages
from clients.merged import merged_reply
from fedsketch import wire
from fedsketch.client.cohort import ClientOutcome
from fedsketch.config import RunConfig

CFG = RunConfig.from_mapping({"strategy": "fedavg", "merge-uploads": True})


def test_a_client_that_failed_without_a_reason_is_reported_as_an_unknown_error() -> None:
    content = RecordDict()
    outcomes = [ClientOutcome(1, None), ClientOutcome(2, None, error="ValueError: no data")]
    merged_reply(CFG, content, outcomes, {}, 4, 3)
    assert content.config_records[wire.failure_key(1)][wire.REASON] == "unknown error"
    assert content.config_records[wire.failure_key(2)][wire.REASON] == "ValueError: no data"
    assert wire.MERGED_KEY not in content.array_records  # nothing was accepted: no mean


def test_the_accepted_uploads_are_one_example_weighted_mean_beside_each_clients_billed_metrics() -> None:
    content = RecordDict()
    ups = {cid: {"update": np.full(4, float(cid), np.float32)} for cid in (1, 2)}
    outcomes = [ClientOutcome(cid, ups[cid], num_examples=cid, loss=0.5) for cid in (1, 2)]
    merged_reply(CFG, content, outcomes, {}, 4, 3)
    mean = content.array_records[wire.MERGED_KEY]["update"].numpy()
    np.testing.assert_allclose(mean, np.full(4, (1 * 1 + 2 * 2) / 3, np.float32))
    assert dict(content.metric_records[wire.MERGED_METRICS]) == {wire.NUM_EXAMPLES: 3, wire.CLIPPED: 0}
    for cid in (1, 2):
        metrics = content.metric_records[wire.metrics_key(cid)]
        assert metrics[wire.UPLOAD_BYTES] == messages.payload_bytes(ups[cid])
        assert metrics[wire.NUM_EXAMPLES] == cid
