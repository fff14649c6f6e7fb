"""The operator's numbers in the environment (`kb.settings`): a value kb-mcp cannot use is refused by
name, through the real command line, before anything is written; unset and empty mean the default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.kb import backups, settings
from kb_mcp.kb.errors import SettingError
from kb_mcp.kb.store import KBStore


def _cli(kb: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("value", ["-1", "abc", "2.5", "1e3"])
def test_a_backup_count_that_is_not_a_whole_number_deletes_no_backup(kb_path: Path, value: str) -> None:
    KBStore.open(kb_path)
    for _ in range(3):
        assert _cli(kb_path, {}, "kb", "backup").returncode == 0
    kept = [b.path for b in backups.list_backups(kb_path)]
    done = _cli(kb_path, {"KB_MCP_BACKUPS": value}, "kb", "backup")
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert f"$KB_MCP_BACKUPS={value!r} is not a whole number, 0 or more" in done.stderr
    assert "unset it for the default (5)" in done.stderr
    assert [b.path for b in backups.list_backups(kb_path)] == kept  # before: -1 was read as 0 and deleted them


@pytest.mark.parametrize("value", ["abc", "-5", "nan", "inf"])
def test_a_lock_timeout_that_is_not_seconds_is_refused_by_name(kb_path: Path, value: str) -> None:
    KBStore.open(kb_path)
    before = kb_path.read_bytes()
    done = _cli(kb_path, {"KB_MCP_LOCK_TIMEOUT": value}, "kb", "import", str(kb_path.with_name("other.json")))
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert f"$KB_MCP_LOCK_TIMEOUT={value!r} is not a number of seconds, 0 or more" in done.stderr
    assert kb_path.read_bytes() == before


def test_unset_and_empty_settings_are_the_default_and_good_ones_are_read() -> None:
    assert settings.count("X", 5, {}) == 5 and settings.count("X", 5, {"X": " "}) == 5
    assert settings.count("X", 5, {"X": "0"}) == 0 and settings.count("X", 5, {"X": " 12 "}) == 12
    assert settings.seconds("X", 60.0, {"X": ""}) == 60.0 and settings.seconds("X", 60.0, {"X": "0.5"}) == 0.5
    with pytest.raises(SettingError) as err:
        settings.seconds("X", 60.0, {"X": "-1"})
    assert err.value.whose == "environment" and err.value.where == "X"


def test_a_positive_duration_refuses_zero_and_a_word_refuses_any_other_word() -> None:
    assert settings.seconds("X", 60.0, {"X": "0"}) == 0.0
    with pytest.raises(SettingError, match=r"\$X='0' is not a number of seconds, more than 0"):
        settings.seconds("X", 60.0, {"X": "0"}, positive=True)
    assert settings.count("X", 5, {"X": "1"}, positive=True) == 1
    with pytest.raises(SettingError, match=r"\$X='0' is not a whole number, more than 0"):
        settings.count("X", 5, {"X": "0"}, positive=True)
    words = {"on": True, "off": False}
    assert settings.word("X", "on", words, {}) is True and settings.word("X", "on", words, {"X": " OFF "}) is False
    with pytest.raises(SettingError) as err:
        settings.word("X", "on", words, {"X": "maybe"})
    assert "$X='maybe' is not one of 'on', 'off'" in str(err.value) and "the default (on)" in str(err.value)
    assert err.value.where == "X"


@pytest.mark.parametrize("value", ["0", "-3", "\u00b2", "1.5"])
def test_a_positive_count_refuses_zero_and_anything_but_ascii_digits_by_name(value: str) -> None:
    assert settings.count("X", 16, {"X": "0"}) == 0 and settings.count("X", 16, {"X": "7"}, positive=True) == 7
    with pytest.raises(SettingError, match=r"is not a whole number, more than 0.*unset it for the default \(16\)"):
        settings.count("X", 16, {"X": value}, positive=True)
    with pytest.raises(SettingError):  # before: a superscript two passed as a digit and int() raised
        settings.count("X", 16, {"X": "\u00b2"})


@pytest.mark.parametrize(("value", "expected"), [("", True), ("ON", True), ("yes", True), ("1", True),
                                                 ("off", False), ("False", False), ("no", False), ("0", False)])
def test_a_switch_reads_on_and_off_words_in_any_case(value: str, expected: bool) -> None:
    assert settings.switch("KB_MCP_X", True, {"KB_MCP_X": value}) is expected


@pytest.mark.parametrize("value", ["of", "disabled", "2", "maybe"])
def test_a_switch_refuses_any_other_word_whatever_its_default(value: str) -> None:
    for default in (True, False):
        with pytest.raises(SettingError, match=f"KB_MCP_X='{value}' is not one of"):
            settings.switch("KB_MCP_X", default, {"KB_MCP_X": value})
