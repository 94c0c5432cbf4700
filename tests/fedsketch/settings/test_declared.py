"""What each method is, in plain data (fedsketch/settings/declared.py): read, parsed and checked without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fedsketch.config import RunConfig
from fedsketch.settings import declared
from fedsketch.settings.declared import DECLARATIONS, STRATEGIES, TABLE, Declaration, Docs, choices
from fedsketch.settings.setting import Setting

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


def test_a_settings_row_becomes_a_setting_of_its_type() -> None:
    row = {"type": "float", "default": 1, "doc": "a rate", "minimum": 0, "maximum": 2}
    made = declared._setting("x-rate", row)
    assert made == Setting("x-rate", float, 1.0, "a rate", minimum=0.0, maximum=2.0)
    assert type(made.default) is float and type(made.minimum) is float and type(made.maximum) is float
    only_max = declared._setting("x-n", {"type": "int", "default": 3, "doc": "n", "maximum": 9})
    assert only_max == Setting("x-n", int, 3, "n", maximum=9) and only_max.minimum is None
    picked = declared._setting("x-way", {"type": "str", "default": "a", "doc": "w", "choices": ["a", "b"]})
    assert picked == Setting("x-way", str, "a", "w", choices=("a", "b")) and picked.choices == ("a", "b")
    assert declared._setting("x-on", {"type": "bool", "default": True, "doc": "o"}) == Setting("x-on", bool, True, "o")


FULL = {
    "upload": "up",
    "keeps": "keeps",
    "paper": "paper",
    "linear": True,
    "clip": False,
    "keeps-state": {"x-way": "b"},
    "uses": ["k", "momentum"],
    "sweep": {"k": "k"},
    "settings": {"x-way": {"type": "str", "default": "a", "doc": "w", "choices": ["a", "b"]}},
}


def test_a_methods_table_becomes_its_declaration() -> None:
    made = declared._declaration("mine", FULL)
    way = Setting("x-way", str, "a", "w", choices=("a", "b"))
    assert made == Declaration(
        "mine", Docs("up", "keeps", "paper"), True, False, {"x-way": "b"}, (way,), ("k", "momentum"), {"k": "k"}
    )
    bare = {k: v for k, v in FULL.items() if k not in ("settings", "sweep")}
    least = declared._declaration("least", {**bare, "keeps-state": False})
    assert (least.settings, dict(least.sweep), least.keeps_state, least.uses) == ((), {}, False, ("k", "momentum"))


def test_the_methods_folder_is_read_file_by_file_every_table_by_name(tmp_path: Path) -> None:
    least = {k: v for k, v in FULL.items() if k not in ("settings", "sweep", "keeps-state")}
    row = "\n".join(f"{k} = {json.dumps(v)}" for k, v in least.items()) + "\nkeeps-state = false\n"
    (tmp_path / "b.toml").write_text(f"[zeta]\n{row}\n[alpha]\n{row}")
    (tmp_path / "a.toml").write_text(f"[mid]\n{row}")
    (tmp_path / "notes.txt").write_text("[ignored]\n")
    read = declared._read(tmp_path)
    assert list(read) == ["alpha", "mid", "zeta"] and all(read[name].name == name for name in read)
    assert read["mid"] == declared._declaration("mid", {**least, "keeps-state": False})
    assert declared._read(tmp_path / "none") == {}
