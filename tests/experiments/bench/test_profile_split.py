"""experiments/bench/profile_split.py: py-spy's raw stacks summed by the parts of a round."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.bench import profile_split

SERVER = 'process 1:"python";run (flwr/server/run_serverapp.py:60);FedSketchStrategy.start (strategies/strategy.py:174)'
LINES = [
    f"{SERVER};aggregate_train (strategies/strategy.py:125);collect (strategies/replies.py:132);_amax (numpy/_methods.py:41) 40",
    f"{SERVER};finish_round (strategies/strategy.py:210);server_step (fedsketch/methods/method.py:250) 20",
    f"{SERVER};exchange (strategies/replies.py:70);send_and_receive (strategies/waiting.py:90);Event.wait (threading.py:629) 80",
    'process 1:"python";train (clients/client_app.py:130);add_update (bridge/messages.py:290);npy_array (bridge/messages.py:118) 10',
    "not a stack line",
]


def test_parts_own_functions_and_innermost_frames_are_summed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "raw.txt"
    path.write_text("\n".join(LINES) + "\n")
    parts, own, innermost, total = profile_split.tally(path)
    assert total == 150
    assert parts["server: read and check the replies"] == 40
    assert parts["server: the method's step"] == 20
    assert parts["server: wait for the replies"] == 80
    assert parts["node: the reply's records"] == 10 and parts["node: all of the ClientApp"] == 10
    assert own["FedSketchStrategy.start (strategies/strategy.py)"] == 140  # line numbers dropped: counted once a stack
    assert "Event.wait (threading.py)" not in innermost and innermost["_amax (numpy/_methods.py)"] == 40
    profile_split.main([str(path), "--rate", "10", "--top", "3"])
    out = capsys.readouterr().out
    assert "150 samples at 10 a second: 15.0 thread-seconds" in out
    assert "| server: read and check the replies | 4.0 |" in out
    assert "| node: the reply's records | 1.0 |" in out
