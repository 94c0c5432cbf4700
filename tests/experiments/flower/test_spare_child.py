"""The spare's side after the fork (experiments/flower/spare_child.py): its helpers, in this process.

The spare itself (``be_the_spare``: forked, given a run or let go) is tested through real forks in
``test_spare.py``, which credit what the fork ran to their test when mutmut records it (``tests/forked_credit.py``).
"""

from __future__ import annotations

import io
import logging
import os
import threading

from experiments.flower import spare_child


def _pipe_with(*writes: bytes, close: bool = True) -> int:
    read, write = os.pipe()
    for data in writes:
        os.write(write, data)
    if close:
        os.close(write)
    return read


def test_a_line_is_read_whole_across_writes_and_longer_than_one_read() -> None:
    assert spare_child._read_line(_pipe_with(b'{"log_', b'file": "x"}\n')) == '{"log_file": "x"}\n'
    long = b"x" * 10_000 + b"\n"
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, long), os.close(write)))
    writer.start()
    assert spare_child._read_line(read) == long.decode()
    writer.join()


def test_the_line_ends_at_its_newline_and_without_one_at_the_inputs_end() -> None:
    read = _pipe_with(b"first\n", close=False)
    assert spare_child._read_line(read) == "first\n"  # returns without waiting for the input's end
    assert spare_child._read_line(_pipe_with(b"no newline")) == "no newline"
    assert spare_child._read_line(_pipe_with()) == ""


def test_every_handler_on_the_commands_streams_writes_to_the_new_one() -> None:
    old_out, old_err, elsewhere, new = io.StringIO(), io.StringIO(), io.StringIO(), io.StringIO()
    root, named = logging.getLogger(), logging.getLogger("fedsketch.test.spare_child")
    handlers = [
        (root, logging.StreamHandler(old_err)),
        (named, logging.StreamHandler(old_out)),
        (named, logging.StreamHandler(elsewhere)),
    ]
    for logger, handler in handlers:
        logger.addHandler(handler)
    try:
        spare_child._log_to_the_new_stream({id(old_out), id(old_err)}, new)
        assert [h.stream for _, h in handlers] == [new, new, elsewhere]
    finally:
        for logger, handler in handlers:
            logger.removeHandler(handler)


def test_a_placeholder_in_the_loggers_table_is_passed_over() -> None:
    old_err, new = io.StringIO(), io.StringIO()
    logging.getLogger("fedsketch.test.parent.child")  # makes a PlaceHolder for "fedsketch.test.parent"
    assert isinstance(logging.Logger.manager.loggerDict["fedsketch.test.parent"], logging.PlaceHolder)
    handler = logging.StreamHandler(old_err)
    logging.getLogger("fedsketch.test.parent.child").addHandler(handler)
    try:
        spare_child._log_to_the_new_stream({id(old_err)}, new)
        assert handler.stream is new
    finally:
        logging.getLogger("fedsketch.test.parent.child").removeHandler(handler)
