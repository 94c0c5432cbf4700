"""What each method is, in plain data (fedsketch/settings/declared.py): read, parsed and checked without torch."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from fedsketch.config import RunConfig
from fedsketch.settings.declared import DECLARATIONS, STRATEGIES, TABLE, choices

PARSE_EVERY_STRATEGY = """
import fedsketch.config as c
from fedsketch.settings.declared import STRATEGIES
for name in STRATEGIES:
    c.RunConfig.from_mapping({"strategy": name, "download": "sparse", "clip-norm": 0.0, "model": "cnn"})
"""


def _imported(code: str) -> set[str]:
    """The modules ``python -X importtime -c code`` imports, by name."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("code", ["import fedsketch.config", PARSE_EVERY_STRATEGY], ids=["import", "parse"])
def test_parsing_and_checking_a_runs_settings_imports_no_torch(code: str) -> None:
    imported = _imported(code)
    assert "fedsketch.config" in imported and "fedsketch.validate" in imported
    assert not {name for name in imported if name.split(".")[0] == "torch" or name.startswith("fedsketch.methods")}


def test_a_state_rule_holds_only_when_every_setting_it_names_has_its_value() -> None:
    topk = DECLARATIONS["local_topk"]
    assert topk.keeps_state == {"local-topk-error": "client"}
    assert topk.keeps_state_with(RunConfig(strategy="local_topk"))
    assert not topk.keeps_state_with(RunConfig.from_mapping({"strategy": "local_topk", "local-topk-error": "none"}))
    both = replace(topk, settings=(*topk.settings, *DECLARATIONS["signsgd"].settings))
    both = replace(both, keeps_state={"local-topk-error": "client", "signsgd-variant": "ef"})
    assert both.keeps_state_with(RunConfig())
    assert not both.keeps_state_with(RunConfig.from_mapping({"signsgd-variant": "majority"}))
    assert DECLARATIONS["powersgd"].keeps_state_with(RunConfig()) and not DECLARATIONS["qsgd"].keeps_state_with(
        RunConfig()
    )


def test_the_fixed_choices_are_the_tables() -> None:
    assert choices("download") == ("dense", "sparse") == tuple(TABLE["download"]["choices"])
    assert STRATEGIES == tuple(sorted(DECLARATIONS)) and all(DECLARATIONS[n].name == n for n in STRATEGIES)
