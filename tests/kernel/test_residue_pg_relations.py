"""PostgreSQL places the residue scan did not read (bug PU, decision 0198-residue-in-progress).

0196 left them: bytea inside a composite type, large objects, foreign tables, relations
created after the scan listed the others. Each test plants an erased subject's name
there and asks the whole audit; each is read, or named ``unscanned``: never clean.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tests.kernel.conftest import residue_found
from tests.kernel.test_residue_review_0187 import ZOE, _planted, pg_only
from uprof.kernel import Uprof


@pg_only
def test_bytes_inside_a_composite_type_are_scanned(kernel: Uprof) -> None:
    """A bytea field of a composite column (and of an array of them) was read ``::text``,
    which prints it as ``\\x5a6f..``: the name was in no spelling the matcher knows."""
    with _planted(
        kernel,
        ("CREATE TYPE zpair AS (note bytea, n int)", {}),
        ("CREATE TABLE znested (one zpair, many zpair[])", {}),
        (
            "INSERT INTO znested VALUES (ROW(convert_to(:z, 'UTF8'), 1)::zpair, NULL), "
            "(NULL, ARRAY[ROW(:b, 2)::zpair])",
            {"z": ZOE, "b": ZOE.encode("utf-16-be")},
        ),
        drop="DROP TABLE znested; DROP TYPE zpair",
    ):
        found = residue_found(kernel, ZOE, "znested")
    assert sorted(found) == ["znested.many row (0,2)", "znested.one row (0,1)"], found


@pg_only
def test_large_objects_are_scanned(kernel: Uprof) -> None:
    """``pg_largeobject`` is a catalog table (left out with the server's own): a large
    object holding the name, one holding it across the scan's 1 MiB read border, and
    none of the others was found."""
    border = b"x" * ((1 << 20) - 5) + ZOE.encode() + b"y" * 10
    with kernel.views_engine.begin() as conn:
        small = conn.execute(
            sa.text("SELECT lo_from_bytea(0, convert_to(:z, 'UTF8'))"), {"z": f"to {ZOE}."}
        ).scalar_one()
        big = conn.execute(sa.text("SELECT lo_from_bytea(0, :b)"), {"b": border}).scalar_one()
        plain = conn.execute(sa.text("SELECT lo_from_bytea(0, 'nothing')")).scalar_one()
    try:
        found = residue_found(kernel, ZOE, "large object")
    finally:
        with kernel.views_engine.begin() as conn:
            for oid in (small, big, plain):
                conn.execute(sa.text("SELECT lo_unlink(:o)"), {"o": oid})
    assert f"large object {small}.data row from byte 0" in found, found
    # Found in the window after the border, which starts before it by the overlap.
    (across,) = [f for f in found if f.startswith(f"large object {big}.")]
    assert int(across.rsplit(" ", 1)[1]) < (1 << 20) - 5 < (1 << 20), across
    assert not [f for f in found if f.startswith(f"large object {plain}.")], found


@pg_only
def test_a_foreign_table_is_named_unscanned(kernel: Uprof) -> None:
    """A foreign table's rows are another server's: the audit does not query that
    server, and says so, naming the table (on main it was not listed at all)."""
    with _planted(
        kernel,
        ("CREATE EXTENSION IF NOT EXISTS postgres_fdw", {}),
        (
            "CREATE SERVER zremote FOREIGN DATA WRAPPER postgres_fdw "
            "OPTIONS (host '127.0.0.1', dbname 'postgres')",
            {},
        ),
        ("CREATE FOREIGN TABLE zforeign (note text) SERVER zremote", {}),
        drop="DROP EXTENSION postgres_fdw CASCADE",
    ):
        report = kernel.residue_scan([ZOE])
    unscanned = [f for f in report.findings if f.kind == "unscanned"]
    assert [f.location for f in unscanned] == ["zforeign"], report.findings
    assert "another server" in unscanned[0].detail


@pg_only
def test_relations_created_during_the_scan_are_read_or_named(kernel: Uprof) -> None:
    """One table is created (holding the name) while the scan reads its first relation:
    the scan lists again once it has read the others, and finds it. Another is created
    while it reads that one, after its last listing: named ``unscanned``, not passed
    over (on main both were never seen)."""
    engine = kernel.views_engine
    listings = 0
    made: list[str] = []

    def create(name: str) -> None:
        with engine.begin() as other:  # another connection: its own transaction
            other.exec_driver_sql(f"CREATE TABLE {name} (note text)")
            other.execute(sa.text(f"INSERT INTO {name} VALUES (:z)"), {"z": ZOE})
        made.append(name)

    def listen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal listings
        if "WITH RECURSIVE base" in statement:
            listings += 1
        elif "ctid" in statement and len(made) < listings <= 2:
            create(f"zlate{listings}")

    sa.event.listen(engine, "before_cursor_execute", listen)
    try:
        report = kernel.residue_scan([ZOE])
    finally:
        sa.event.remove(engine, "before_cursor_execute", listen)
        with engine.begin() as conn:
            for name in made:
                conn.exec_driver_sql(f"DROP TABLE {name}")
    assert made == ["zlate1", "zlate2"]
    hits = [f.location for f in report.findings if f.kind == "plaintext"]
    assert hits == ["zlate1.note row (0,1)"], report.findings
    unscanned = [f for f in report.findings if f.kind == "unscanned"]
    assert [f.location for f in unscanned] == ["zlate2"], report.findings
    assert "created while the scan read" in unscanned[0].detail
