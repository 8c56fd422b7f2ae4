"""The residue audit finds a term however a store spells it, and lets writers be.

Bugs OP, OQ, OR, OS (decision 0187-residue-at-scale). An auditor types a name as
they know it; the stores hold it as the user typed it, in some case, in some Unicode
normal form, inside JSON (escaped as ``json.dumps`` writes it), in a PostgreSQL bytea
column. Each test plants the text where the system or an operator's tool could leave
it (a file in the data folder, a SQLite file, a PostgreSQL table) and asks the scan.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from benchmarks.residue_scale_bench import per_column_scan
from tests.conftest import Backend
from tests.kernel.conftest import consent, plant_file, residue_found, say
from uprof.backends import backend_for
from uprof.kernel import Uprof
from uprof.services.residue_files import CHUNK

pg_only = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

ZOE = "Zoë Šimková"
QUOTED = 'Anne "Nan" Qzxlee'


# --- OP: case ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "term"),
    [
        ("Alice Qzxwonderland", "alice QZXWONDERLAND"),  # ASCII, mixed case
        (ZOE, "ZOË šimková"),  # non-ASCII letters, mixed case
        ("STRASSE QZXEINS", "Straße Qzxeins"),  # held: a letter whose upper case is two
    ],
)
def test_a_term_in_another_case_is_found_in_a_file(kernel: Uprof, stored: str, term: str) -> None:
    """OP: the file scan searched the term as typed, all lower and all upper case only:
    "alice QZXWONDERLAND" missed "Alice Qzxwonderland" in an export."""
    plant_file(kernel, "notes.txt", f"met {stored} today".encode())
    assert residue_found(kernel, term, "notes.txt@4"), "the scan missed the term"


def test_a_term_in_another_case_is_found_in_a_sqlite_table(kernel: Uprof) -> None:
    """OP, in a table of a SQLite file (the logical pass): same spellings as the raw pass."""
    path = kernel.settings.data_dir / "exports" / "copy.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES (?)", (f"met {ZOE} today",))
    conn.commit()
    conn.close()
    assert residue_found(kernel, "zoë ŠIMKOVÁ", "copy.sqlite table notes.body row 0")


# --- OP, too: Unicode normal forms -----------------------------------------------------------


@pytest.mark.parametrize(("stored_form", "term_form"), [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_term_in_another_normal_form_is_found(
    kernel: Uprof, stored_form: str, term_form: str
) -> None:
    """OP: "Zoë" pasted from one keyboard is e + U+0308, typed on another U+00EB; the
    scan compared bytes, so one form never found the other."""
    stored = unicodedata.normalize(stored_form, ZOE)
    term = unicodedata.normalize(term_form, ZOE)
    assert stored != term
    plant_file(kernel, "notes.txt", stored.encode())
    assert residue_found(kernel, term, "notes.txt@0")


# --- OR: JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize(("term", "ensure_ascii"), [(ZOE, True), (QUOTED, True), (QUOTED, False)])
def test_a_term_inside_json_is_found(kernel: Uprof, term: str, ensure_ascii: bool) -> None:
    """OR: ``json.dumps`` writes "Zoë" as ``Zo\\u00eb`` by default, and a quote as \\"
    always (stored idempotent answers, exports, log lines): the scan searched the
    term's bytes only."""
    text = json.dumps({"note": f"met {term}"}, ensure_ascii=ensure_ascii)
    plant_file(kernel, "answer.json", text.encode())
    assert residue_found(kernel, term, "answer.json@")


# --- PostgreSQL tables: OQ (bytea), OR (json), OP --------------------------------------


@contextmanager
def _planted_table(kernel: Uprof, ddl: str, insert: str, params: dict[str, Any]) -> Iterator[None]:
    """A table of the test's database holding one planted row, dropped at the end."""
    engine = kernel.views_engine
    with engine.begin() as conn:
        conn.execute(sa.text(ddl))
        conn.execute(sa.text(insert), params)
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS residue_planted"))


@pg_only
@pytest.mark.parametrize(
    ("column_type", "value", "term"),
    [
        ("bytea", ZOE.encode("utf-8"), ZOE),  # OQ
        ("bytea", ZOE.encode("utf-8"), "ZOË ŠIMKOVÁ"),  # OQ, other case
        ("bytea", b"met Qzxbytecanary", "QZXBYTECANARY"),  # held: ASCII in bytea
        ("json", json.dumps({"n": ZOE}), ZOE),  # OR: json keeps the escapes as written
        ("json", json.dumps({"n": QUOTED}, ensure_ascii=False), QUOTED),  # OR
        ("jsonb", json.dumps({"n": ZOE}), ZOE),  # held: jsonb prints UTF-8
        ("text", unicodedata.normalize("NFD", ZOE), ZOE),  # OP
        ("text", ZOE, "zoë šimková"),  # held: lower() of C.UTF-8 knows these letters
        ("text", "Alice Qzxwonderland", "alice QZXWONDERLAND"),  # held
    ],
)
def test_a_term_in_a_postgres_column_is_found(
    kernel: Uprof, column_type: str, value: object, term: str
) -> None:
    """OQ: bytea was compared through encode(.., 'escape'), which writes every byte
    above 0x7e as an octal escape: no term with a letter outside ASCII was ever found
    in a bytea column (the event log's payloads, the key store's blobs). OR, OP as in
    the files."""
    given = "bytea" if column_type == "bytea" else "text"
    cast = "" if column_type in ("bytea", "text") else f"::{column_type}"
    with _planted_table(
        kernel,
        f"CREATE TABLE residue_planted (v {column_type})",
        f"INSERT INTO residue_planted VALUES (CAST(:v AS {given}){cast})",
        {"v": value},
    ):
        assert residue_found(kernel, term, "residue_planted.v row ")


@pg_only
def test_a_term_longer_than_its_column_is_no_error_and_no_finding(kernel: Uprof) -> None:
    """Held: a varchar(8) column holds the first letters of a longer term; the scan
    neither fails on the length nor reports the prefix as the term."""
    with _planted_table(
        kernel,
        "CREATE TABLE residue_planted (v varchar(8))",
        "INSERT INTO residue_planted VALUES (:v)",
        {"v": "Qzxlongt"},
    ):
        term = "Qzxlongterm" * 40
        report = kernel.residue_scan([term])
        assert not [f for f in report.findings if "residue_planted" in f.location]
        assert residue_found(kernel, "QZXLONGT", "residue_planted.v row ")


def test_a_long_term_across_a_chunk_border_is_found(kernel: Uprof) -> None:
    """Held: a 4,400-byte term starting 1,000 bytes before the file scan's 1 MiB chunk
    border is found at its offset."""
    term = "Qzx a long phrase the user said " * 137
    head = b"x" * (CHUNK - 1_000)
    plant_file(kernel, "long.txt", head + term.encode() + b"y" * 100)
    assert residue_found(kernel, term, f"long.txt@{len(head)}")


# --- the matcher itself -------------------------------------------------------------------


def test_needles_of_an_ascii_term_are_its_encodings() -> None:
    """An ASCII term costs a few needles: UTF-8, UTF-16 in each byte order, and its
    space percent-escaped both ways (the review of 0187 added the last three, bug PB)."""
    from uprof.services.residue_files import needles

    assert set(needles("Qzx Porto")) == {
        b"qzx porto",
        "qzx porto".encode("utf-16-le"),
        "qzx porto".encode("utf-16-be"),
        b"qzx%20porto",
        b"qzx+porto",
    }


def test_a_term_with_many_cased_letters_keeps_its_uniform_spellings() -> None:
    """Past MAX_SPELLINGS letter-by-letter spellings, the uniform ones are still searched."""
    from uprof.services.residue_files import Matcher, needles

    term = "Ωμέγαλοψυχία Σωκράτης"
    matcher = Matcher([term])
    for stored in (term, term.upper(), term.lower(), unicodedata.normalize("NFD", term)):
        assert matcher.terms_in(stored) == [term], stored
    assert len(needles(term)) < 200


def test_no_false_finding_in_unrelated_text() -> None:
    from uprof.services.residue_files import Matcher

    matcher = Matcher([ZOE, "Qzxporto"])
    assert matcher.terms_in("Zoe Simkova from Porto") == []
    assert matcher.terms_in(b"\x00\xff" * 1000) == []
    assert matcher.terms_in(12345) == []


# --- PostgreSQL: one read per table, the same answers, writers not held (OS) ----------------


def _seeded(kernel: Uprof, subjects: int, each: int) -> None:
    for s in range(subjects):
        subject = f"person-{s}"
        consent(kernel, subject)
        kernel.capture_many(
            subject,
            [
                say(f"Qzxcity{s} visit {i}: lunch with Qzxfriend{i % 3}", ref=f"r{i}")
                for i in range(each)
            ],
        )
    kernel.process()
    kernel.erase_subject("person-0")


@pg_only
def test_one_read_per_table_gives_the_per_column_queries_answers(kernel: Uprof) -> None:
    """The batched scan against the queries it replaced (one per column per term), on
    one seeded and partly erased store (its views hold no plaintext: sealed under the
    subjects' keys) beside a planted table of plain columns of several types, 40 rows,
    ASCII terms (which the old queries handled): the same (table, column, term) found,
    each as many times (at most 5)."""
    _seeded(kernel, subjects=3, each=12)
    rows = [
        {
            "t": f"Qzxcity{i % 4} and Qzxfriend{i % 3}",
            "b": f"visit {i} QZXFRIEND{i % 3}".encode(),
            "j": json.dumps({"note": f"qzxcity{i % 2}", "n": i}),
            "n": i,
        }
        for i in range(40)
    ]
    engine = kernel.views_engine
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE residue_planted (t text, b bytea, j jsonb, n int)"))
        conn.execute(
            sa.text("INSERT INTO residue_planted VALUES (:t, :b, CAST(:j AS jsonb), :n)"), rows
        )
    try:
        # No digit alone: the old queries read bytea through encode(.., 'escape'), where
        # random ciphertext bytes print as octal escapes (\\327): "7" was "found" in
        # sealed columns, a false finding the byte match does not make.
        terms = ["Qzxcity0", "qzxcity1", "QZXFRIEND2", "visit", "nothing-like-this"]
        batched = backend_for(engine).scan_tables(engine, terms)
        reference = per_column_scan(engine, terms)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE residue_planted"))
    assert batched.tables == reference.tables
    assert Counter((h.table, h.column, h.term) for h in batched.hits) == Counter(
        (h.table, h.column, h.term) for h in reference.hits
    )
    planted = Counter((h.column, h.term) for h in batched.hits if h.table == "residue_planted")
    assert planted[("t", "Qzxcity0")] == 5 and planted[("b", "visit")] == 5
    assert planted[("j", "qzxcity1")] == 5 and not [c for c, _ in planted if c == "n"]


def _relation_locks(engine: sa.Engine, pid: int) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                sa.text(
                    "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                    "WHERE l.pid = :pid AND l.granted AND c.relkind = 'r' "
                    "AND c.relnamespace = 'public'::regnamespace"
                ),
                {"pid": pid},
            ).scalars()
        )


def _table_of(statement: str) -> str | None:
    """The table a scan statement reads (``FROM "<table>"``, or since the review of 0187
    ``FROM "<schema>"."<table>"``)."""
    found = re.search(r'FROM (?:"(?:[^"]|"")+"\.)?"((?:[^"]|"")+)"', statement)
    return None if found is None or "ctid" not in statement else found.group(1)


@pg_only
def test_the_scan_holds_no_table_it_has_read(kernel: Uprof, backend: Backend) -> None:
    """OS: the scan ran every query in one transaction, so it held ACCESS SHARE on each
    table it had read until its last query: a DDL or LOCK waiting on any of them (an
    upgrade, an operator's maintenance) queued every writer of that table behind it for
    the rest of the scan. Stopped before its third table, it must hold none of the two it
    read, and an ACCESS EXCLUSIVE lock on them must be granted at once (NOWAIT)."""
    _seeded(kernel, subjects=2, each=3)
    engine = kernel.views_engine
    read: list[str] = []
    held: list[set[str]] = []
    granted: list[bool] = []

    def before_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        table = _table_of(statement)
        if table is None or table in read:
            return
        read.append(table)
        if len(read) != 3:
            return
        held.append(_relation_locks(other, cursor.connection.info.backend_pid))
        with other.connect() as probe:
            probe.exec_driver_sql("SET lock_timeout = 0")
            try:
                for name in read[:2]:
                    probe.exec_driver_sql(f'LOCK TABLE "{name}" IN ACCESS EXCLUSIVE MODE NOWAIT')
                granted.append(True)
            except sa.exc.OperationalError:
                granted.append(False)
            probe.rollback()

    other = sa.create_engine(backend.url, poolclass=sa.pool.NullPool)
    sa.event.listen(engine, "before_cursor_execute", before_execute)
    try:
        backend_for(engine).scan_tables(engine, ["Qzxcity1"])
    finally:
        sa.event.remove(engine, "before_cursor_execute", before_execute)
        other.dispose()
    assert len(read) > 3 and len(held) == 1
    assert not held[0] & set(read[:2]), f"the scan still holds {sorted(held[0])}"
    assert granted == [True], "a lock on a table the scan had read was refused"


WRITER = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, say
from uprof.settings import Settings
url = sys.argv[2] or None
settings = Settings(data_dir=Path(sys.argv[1]), database_url=url, embedder="hashing")
with running(settings, FakeClock()) as k:
    said = [say(f"written beside the scan {i}", ref=f"w{i}") for i in range(20)]
    k.capture_many("person-1", said)
    k.capture("person-1", say("one more", ref="w-last"))
print("done", flush=True)
"""


def run_beside_a_paused_scan(
    kernel: Uprof, backend: Backend, script: str
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (a real process on the kernel's data folder and database) while the
    table scan is stopped before its fourth table's read; the scan goes on once the
    process has ended, and must complete without an error."""
    from tests.children import run_python
    from tests.kernel.conftest import settings_for

    engine = kernel.views_engine
    paused, go_on = threading.Event(), threading.Event()
    statements = 0

    def pause(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal statements
        if "ctid" in statement:
            statements += 1
            if statements == 4:
                paused.set()
                go_on.wait(300)

    errors: list[BaseException] = []

    def scan() -> None:
        try:
            backend_for(engine).scan_tables(engine, ["Qzxcity1"])
        except BaseException as e:  # reported below
            errors.append(e)

    sa.event.listen(engine, "before_cursor_execute", pause)
    thread = threading.Thread(target=scan)
    try:
        thread.start()
        assert paused.wait(120), "the scan never reached its pause"
        done = run_python(script, str(settings_for(backend).data_dir), backend.url, timeout=240)
    finally:
        go_on.set()
        thread.join(300)
        sa.event.remove(engine, "before_cursor_execute", pause)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done" in done.stdout
    assert not errors and not thread.is_alive()
    return done


@pg_only
def test_a_writer_process_finishes_while_the_scan_is_paused(
    kernel: Uprof, backend: Backend
) -> None:
    """Held: a real process captures 21 interactions while the scan is stopped before
    its fourth table's read (on main: inside its one transaction); the writer finishes
    before the scan goes on, and every capture is on the log."""
    _seeded(kernel, subjects=2, each=3)
    stream = kernel.stream_of("person-1")
    before = len(kernel.app.recorder.select_events(stream))
    run_beside_a_paused_scan(kernel, backend, WRITER)
    assert len(kernel.app.recorder.select_events(stream)) >= before + 21


# --- erased streams: rows left, one query per table for all streams -------------------------


def test_rows_put_back_for_erased_streams_are_each_reported(kernel: Uprof) -> None:
    """Held (the check now asks once per table for every erased stream): a memory row
    and a captures row of each of two erased subjects, put back after the erasure, are
    four findings naming their table and stream; a third erased subject, untouched,
    none."""
    from projections.profile import tables as t

    _seeded(kernel, subjects=3, each=4)  # erases person-0
    kept: dict[str, dict[str, dict[str, Any]]] = {}
    for subject in ("person-1", "person-2"):
        stream = str(kernel.stream_of(subject))
        with kernel.views_engine.connect() as conn:
            kept[stream] = {
                table.name: dict(
                    conn.execute(sa.select(table).where(table.c.stream_id == stream))
                    .mappings()
                    .first()
                    or {}
                )
                for table in (t.memories, t.captures)
            }
        kernel.erase_subject(subject)
    with kernel.views_engine.begin() as conn:
        for rows in kept.values():
            for table in (t.memories, t.captures):
                assert rows[table.name], f"no {table.name} row to put back"
                conn.execute(table.insert().values(**rows[table.name]))
    report = kernel.residue_scan(["Qzxcity1"])
    rows_left = sorted(f.location for f in report.findings if f.kind == "row")
    assert rows_left == sorted(
        f"{table} stream {stream}" for stream in kept for table in ("captures", "memories")
    )
    assert report.streams_checked == 3
