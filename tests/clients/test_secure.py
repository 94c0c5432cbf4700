"""Which messages go through Flower's SecAgg+ mod on a node (clients/secure.py): only a secure run's protocol."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from bridge.flower import task_identity
from bridge.legacy import RECORD_KEY_CONFIGS
from clients.secure import secure_aggregation_mod


def _context(secure: bool) -> Context:
    run_config = {"secure-aggregation": secure}
    return Context(run_id=1, node_id=101, node_config={}, state=RecordDict(), run_config=run_config)


def _message(kind: str, protocol: bool) -> Message:
    records = {RECORD_KEY_CONFIGS: ConfigRecord({"stage": "setup"})} if protocol else {"config": ConfigRecord()}
    return Message(RecordDict(records), dst_node_id=101, message_type=kind)


@pytest.mark.parametrize(
    ("kind", "secure", "protocol"),
    [
        (MessageType.TRAIN, False, True),  # the run is not secure: whatever the message holds, the app answers
        (MessageType.EVALUATE, True, True),
        (MessageType.TRAIN, True, False),  # a secure run's message outside the protocol
    ],
)
def test_messages_outside_a_secure_runs_protocol_go_straight_to_the_app(
    kind: str, secure: bool, protocol: bool
) -> None:
    calls: list[tuple[Message, Context]] = []
    context = _context(secure)
    with task_identity():
        msg = _message(kind, protocol)
        answer = Message(RecordDict(), reply_to=msg)

        def app(m: Message, c: Context) -> Message:
            calls.append((m, c))
            return answer

        assert secure_aggregation_mod(msg, context, app) is answer
    assert len(calls) == 1 and calls[0][0] is msg and calls[0][1] is context
