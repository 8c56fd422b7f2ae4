"""0214/0216's damage line (TE: logged once per kind and column) attacked with the text a
damaged store puts in the driver's message (0219-review-of-0216-and-tf), on a live
``uprof serve`` (real process on loopback).

Bug TZ: SQLite's message for a file whose schema is damaged quotes the schema: "malformed
database schema (<an object's name>) - <its SQL text>", both whatever the file holds
(a copied-over, restored or handed-over store), newlines included. The file's damage
carried that text in its message: answered to the caller (500's ``message``) and logged
as is, so the store's text made lines of its own in the server's log (a forged "all
stores restored" under the damage's one line). A table's missing column (TE) is held:
the column is read as a name (letters, digits, ``_``, ``.``), nothing after it."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from tests.conftest import Backend
from tests.e2e.test_store_damage_servers import (
    CONSENTS,
    Served,
    _damaged,
    served,  # noqa: F401  (the fixture)
)
from uprof.backends import damage

#: A line of its own as the server's log writes one: what a store's text must never make.
_FORGED = "ERROR uprof.ops: all stores restored from backup, nothing to do"


def _schema_damaged_by(store: str, name: str, sql: str) -> None:
    """Put an object of ``name`` and ``sql`` into ``store``'s schema as a damaged file
    may hold it, and bump the schema's version, so every connection reads it again."""
    conn = sqlite3.connect(store)
    try:
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute("PRAGMA writable_schema=ON")
        conn.execute(
            "INSERT INTO sqlite_master(type, name, tbl_name, rootpage, sql) "
            "VALUES ('table', ?, ?, 0, ?)",
            (name, name, sql),
        )
        conn.execute(f"PRAGMA schema_version={version + 1}")
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_tz_a_damaged_schemas_text_makes_no_log_line_and_no_answer(
    backend: Backend,
    served: Served,  # noqa: F811
) -> None:
    _schema_damaged_by(
        str(served.settings.data_dir / "views.sqlite"),
        f"x\n{_FORGED}\n",
        f"CREATE TABLE garbage garbage\n{_FORGED}",
    )
    for _ in range(2):
        answer = served.post(*CONSENTS)
        _damaged(answer)
        assert "all stores restored" not in answer.text, answer.text
        assert "garbage" not in answer.text, answer.text
    log = served.log().splitlines()
    damaged = [line for line in log if "is not a database or is damaged" in line]
    assert len(damaged) == 1, log[-40:]
    assert "SQLITE_CORRUPT" in damaged[0] and "malformed database schema" in damaged[0]
    own_lines = [line for line in log if "all stores restored" in line and line not in damaged]
    assert own_lines == [], own_lines


def test_held_a_missing_columns_name_carries_nothing_after_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TE's column, from a real driver's text naming a column of a newline and a forged
    line (a trigger's reference may name anything): the log's name stops at the newline."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t(a)")
    try:
        conn.execute(f'SELECT t."a_gone\n{_FORGED}" FROM t')
    except sqlite3.OperationalError as error:
        found = damage.store_damage(error)
    else:
        pytest.fail("the column was found")
    assert found is not None and found.detail == "column a_gone missing", found
    monkeypatch.setattr(damage, "_reported", set())  # logged once per process: a fresh one
    with caplog.at_level(logging.ERROR, logger=damage.__name__):
        damage.log_store_damage(found)
    assert [r.getMessage().count("\n") for r in caplog.records] == [0], caplog.text
    assert "all stores restored" not in caplog.text


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_held_a_missing_columns_name_carries_nothing_after_it_on_postgresql(
    backend: Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same from PostgreSQL's ``UndefinedColumn`` (its primary message, as TE reads it)."""
    import sqlalchemy as sa

    engine = sa.create_engine(backend.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as raised:
            conn.execute(sa.text(f'SELECT t."a_gone\n{_FORGED}" FROM (SELECT 1 AS a) t'))
    finally:
        engine.dispose()
    found = damage.store_damage(raised.value)
    assert found is not None and found.detail == "column a_gone missing", found
    monkeypatch.setattr(damage, "_reported", set())  # logged once per process: a fresh one
    with caplog.at_level(logging.ERROR, logger=damage.__name__):
        damage.log_store_damage(found)
    assert [r.getMessage().count("\n") for r in caplog.records] == [0], caplog.text
    assert "all stores restored" not in caplog.text
