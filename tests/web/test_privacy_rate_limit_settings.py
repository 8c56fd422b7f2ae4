"""Bad values of ``UPROF_PRIVACY_RATE_LIMIT`` are refused at start, naming the setting.

Found in the review of 0108/0109: ``0/minute`` (or any limit of 0) was accepted and made
every privacy-center page a 429 for good (``limits`` counts 0 as "nothing allowed"), so a
typo locked every data subject out of their access and erasure pages without a word at
start; an empty value turned the default-on limit off (an unset template variable); and
a value the parser refused was reported as "error: configuration: Value error, 'abc' is
not a rate limit", without saying which of the two rate-limit settings was wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from uprof.settings import Settings


@pytest.mark.parametrize("value", ["0/minute", "30/minute;0/hour", "", "  "])
def test_a_limit_that_refuses_everything_or_says_nothing_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="privacy_rate_limit"):
        Settings(privacy_rate_limit=value)


def test_the_default_is_on_and_off_turns_it_off() -> None:
    """The guard: the documented values still work (and REST's limit, off by default,
    still takes an empty value as off)."""
    assert Settings().privacy_rate_limit == "30/minute;300/hour"
    assert Settings(privacy_rate_limit="off").privacy_rate_limit is None
    assert Settings(privacy_rate_limit="5/minute").privacy_rate_limit == "5/minute"
    assert Settings(rate_limit="").rate_limit is None


def test_the_cli_names_the_setting_it_refuses(tmp_path: Path) -> None:
    """A real ``uprof serve`` with a bad value exits 2 before serving, naming the variable."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(tmp_path / "data"),
        "UPROF_PRIVACY_RATE_LIMIT": "lots",
    }
    done = subprocess.run(
        [sys.executable, "-m", "uprof.cli.main", "serve", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "UPROF_PRIVACY_RATE_LIMIT" in done.stderr.replace("\n", ""), done.stderr
