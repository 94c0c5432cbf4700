"""The federation in one process (experiments/running/inprocess_grid.py): each node runs the app on its own copy."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from bridge.flower import task_identity
from experiments.running.inprocess_grid import InProcessGrid


def _echo(msg: Message, context: Context) -> Message:
    """A node's app: counts its messages in its state, says who it is, and spoils the copy it received."""
    seen = context.state.config_records.setdefault("seen", ConfigRecord({"n": 0}))
    seen["n"] = int(seen["n"]) + 1
    said = ConfigRecord({"partition": int(context.node_config["partition-id"]), "n": seen["n"]})
    msg.content.config_records["request"]["spoiled"] = True
    return Message(RecordDict({"said": said}), reply_to=msg)


def _requests(nodes: list[int]) -> list[Message]:
    return [
        Message(RecordDict({"request": ConfigRecord({"x": 1})}), dst_node_id=node, message_type="train")
        for node in nodes
    ]


def test_each_node_answers_its_copy_in_its_own_context_which_persists() -> None:
    grid = InProcessGrid({"num-rounds": 3}, num_nodes=2, app=_echo)
    assert grid.get_node_ids() == [101, 102]
    assert [c.node_config for c in grid.contexts.values()] == [
        {"partition-id": 0, "num-partitions": 2},
        {"partition-id": 1, "num-partitions": 2},
    ]
    assert all(c.run_config == {"num-rounds": 3} and c.run_id == 1 for c in grid.contexts.values())  # the task's run
    assert [c.node_id for c in grid.contexts.values()] == [101, 102]
    assert InProcessGrid({}).get_node_ids() == [101, 102]  # two nodes unless told
    with task_identity():
        requests = _requests([102, 101])
        replies = grid.send_and_receive(requests)
        assert [r.metadata.reply_to_message_id for r in replies] == ["0.0", "0.1"]
        assert [dict(r.content.config_records["said"]) for r in replies] == [
            {"partition": 1, "n": 1},
            {"partition": 0, "n": 1},
        ]
        assert all("spoiled" not in m.content.config_records["request"] for m in requests)  # each node got a copy
        again = grid.send_and_receive(_requests([101]))
    assert dict(again[0].content.config_records["said"]) == {"partition": 0, "n": 2}  # its state kept
    assert again[0].metadata.reply_to_message_id == "1.0" and grid.exchanges == 2


def test_replies_are_handed_out_once_and_an_unpulled_push_is_dropped() -> None:
    grid = InProcessGrid({}, num_nodes=2, app=_echo)
    assert grid.pull_messages([]) == []  # nothing pushed yet
    with task_identity():
        ids = grid.push_messages(_requests([101]))
        grid.push_messages(_requests([102]))  # nobody pulled the first push's reply
        replies = grid.pull_messages(ids)
        assert [r.metadata.reply_to_message_id for r in replies] == ["1.0"]
        assert grid.pull_messages(ids) == []
