"""Every ``UPROF_*`` variable uprof reads refuses a byte that is not UTF-8 (bug PD;
decision 0189's Left: the command line was swept, the environment not).

Python reads such a byte of the environment as a lone surrogate (``\\udcff``). The
settings took it as text: ``UPROF_DATA_DIR``, ``UPROF_TENANT``, ``UPROF_MASTER_SECRET``,
``UPROF_DATABASE_URL`` ... reached the stores, the key derivation or the driver and ended
in a ``UnicodeEncodeError`` traceback (exit 1), after the data folder was made. Each is
now refused when the settings are read, naming the variable, exit 2, nothing made; and
``UPROF_API_KEY`` (``uprof mcp``, read apart from the settings) likewise, before the
start. A NUL cannot be in a real environment (``execve`` ends a string at it; ``os.environ``
refuses it): it is held by the settings built in code (an embedding program's).

The fields are not listed by hand: every field of ``Settings`` is tried.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.children import run_python
from uprof.cli.main import app
from uprof.settings import Settings

#: What Python makes of the byte 0xff in an environment variable.
NOT_UTF8 = "\udcff"

#: A value each field takes, the byte appended to it (or put inside a path).
_PLAIN: dict[str, str] = {
    "database_url": "postgresql+psycopg://postgres@127.0.0.1/uprof_env_x",
    "master_secret": "s" * 40,
    "rate_limit": "5/second",
    "privacy_rate_limit": "5/second",
    "llm_base_url": "http://127.0.0.1:1/v1",
}


def _hostile(field: str, tmp_path: Path) -> str:
    annotation = str(Settings.model_fields[field].annotation)
    if "Path" in annotation:
        return str(tmp_path / f"d{NOT_UTF8}")
    return _PLAIN.get(field, "1") + NOT_UTF8


FIELDS = sorted(Settings.model_fields)


def _variable(field: str) -> str:
    return f"UPROF_{field.upper()}"


@pytest.mark.parametrize("field", FIELDS)
def test_a_setting_not_utf8_in_the_environment_is_refused_naming_it(
    field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PD: exit 2, the variable named, no traceback, nothing made under its path."""
    for name in list(os.environ):
        if name.upper().startswith("UPROF_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    env = {"UPROF_DATA_DIR": str(tmp_path / "data"), "UPROF_EMBEDDER": "hashing"}
    env[_variable(field)] = _hostile(field, tmp_path)
    result = CliRunner().invoke(app, ["apps", "list"], env=env)
    said = " ".join(result.output.split())
    assert result.exit_code == 2, (result.exit_code, said, result.exception)
    assert f"{_variable(field)}:" in said and "UTF-8" in said, said
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("field", ["tenant", "audit_origin", "llm_model"])
def test_a_nul_in_a_setting_built_in_code_is_refused_naming_it(field: str) -> None:
    """Held (a NUL cannot come from a real environment): a setting given in code."""
    with pytest.raises(ValidationError, match="NUL") as raised:
        Settings(**{field: "a\x00b"})  # type: ignore[arg-type]
    assert raised.value.errors()[0]["loc"] == (field,)


def test_a_nul_cannot_be_put_in_the_environment() -> None:
    """Held: the reason a NUL is tried in code only."""
    with pytest.raises(ValueError, match="null"):
        os.environ["UPROF_TENANT"] = "a\x00b"


@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        ("UPROF_DATA_DIR", "d" + NOT_UTF8, ("apps", "list")),
        ("UPROF_TENANT", "t" + NOT_UTF8, ("apps", "list")),
        ("UPROF_MASTER_SECRET", "s" * 40 + NOT_UTF8, ("apps", "list")),
        ("UPROF_API_KEY", "k" + NOT_UTF8, ("mcp",)),
    ],
)
def test_a_real_process_refuses_a_variable_not_utf8_naming_it(
    variable: str, value: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    """PD in a real process (the byte 0xff in its environment, as a shell sets it):
    exit 2 naming the variable; on main a ``UnicodeEncodeError`` traceback (exit 1), or
    for the API key a refusal that took it for a revoked key."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("UPROF_")}
    env.update(UPROF_DATA_DIR=str(tmp_path / "data"), UPROF_EMBEDDER="hashing")
    env[variable] = str(tmp_path / value) if variable == "UPROF_DATA_DIR" else value
    done = run_python("from uprof.cli.main import app\napp()\n", *command, env=env, timeout=120)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, (done.returncode, said[-2000:])
    assert f"{variable}:" in said and "UTF-8" in said and "Traceback" not in said, said
