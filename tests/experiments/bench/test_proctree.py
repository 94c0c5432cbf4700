"""The process-tree sampler the peer benchmark measures memory with, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from experiments.bench.proctree import TreeSampler, tag_env

# A child that starts a grandchild in a session of its own (as Ray starts its processes), and each
# touches MB megabytes of its own memory, so the tree's PSS is at least 2 x MB.
MB = 150
CHILD = textwrap.dedent(f"""
    import subprocess, sys, time
    grand = subprocess.Popen([sys.executable, "-c", "b = bytearray({MB} << 20); import time; time.sleep(3)"],
                             start_new_session=True)
    b = bytearray({MB} << 20)
    time.sleep(3)
    grand.wait()
""")


@pytest.mark.slow  # three real processes, seconds each
def test_the_sampler_sums_every_process_of_the_tree_and_nothing_else() -> None:
    env, tag = tag_env(dict(os.environ))
    outsider = subprocess.Popen([sys.executable, "-c", f"b = bytearray({4 * MB} << 20); import time; time.sleep(4)"])
    try:
        with TreeSampler(tag, interval_s=0.1) as tree:
            subprocess.run([sys.executable, "-c", CHILD], env=env, check=True)
    finally:
        outsider.kill()
        outsider.wait()
    assert 2 * MB <= tree.peak_mb < 4 * MB  # both tagged processes, not the untagged one beside them
    assert sum(parts[0] for parts in tree.at_peak.values()) == tree.peak_mb
    assert all(0 <= t < 10 for t in tree.first_seen.values())


def test_a_tree_that_is_gone_is_not_counted() -> None:
    env, tag = tag_env(dict(os.environ))
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    with TreeSampler(tag, interval_s=0.05) as tree:
        time.sleep(0.3)
    assert tree.peak_mb == 0.0 and not tree.first_seen
