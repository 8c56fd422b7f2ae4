"""Review of decision 0187 (the residue audit at scale): where a false "clean" hides.

Bugs OZ, PA, PB, PC (decision 0196-review-of-0187). Each test plants an erased subject's
words where a store, an operator's tool or the service itself could leave them, and asks
the whole audit (``Uprof.residue_scan``) on both backends where storage is involved; the
held tests keep what was attacked and found correct.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Backend
from tests.kernel.conftest import consent, plant_file, residue_found, say
from tests.kernel.test_residue_spellings import run_beside_a_paused_scan
from uprof.kernel import Uprof
from uprof.services.residue import IN_PROGRESS
from uprof.services.residue_files import CHUNK

pg_only = pytest.mark.parametrize("backend", ["postgres"], indirect=True)
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

ZOE = "Zoë Šimková"


@contextmanager
def _planted(kernel: Uprof, *statements: tuple[str, dict[str, Any]], drop: str) -> Iterator[None]:
    """Run the statements on the views database (PostgreSQL), undo with ``drop`` after."""
    with kernel.views_engine.begin() as conn:
        for sql, params in statements:
            conn.execute(sa.text(sql), params)
    try:
        yield
    finally:
        with kernel.views_engine.begin() as conn:
            conn.execute(sa.text(drop))


# --- OZ: PostgreSQL relations outside the default schema -------------------------------------


@pg_only
def test_a_table_in_another_schema_is_scanned(kernel: Uprof) -> None:
    """OZ: the scan listed the tables of the connection's default schema only; a copy an
    operator kept in a schema of its own (``archive.memories_2025``) held the erased
    subject's name and the audit said clean."""
    with _planted(
        kernel,
        ("CREATE SCHEMA residue_archive", {}),
        ("CREATE TABLE residue_archive.notes (body text)", {}),
        ("INSERT INTO residue_archive.notes VALUES (:v)", {"v": f"met {ZOE}"}),
        drop="DROP SCHEMA residue_archive CASCADE",
    ):
        assert residue_found(kernel, ZOE, "residue_archive.notes.body row ")


@pg_only
def test_a_materialized_view_is_scanned(kernel: Uprof) -> None:
    """OZ: a materialized view stores its rows like a table (a report an operator
    built from the memories); the catalog listing of tables left it out."""
    with _planted(
        kernel,
        ("CREATE TABLE residue_src (body text)", {}),
        ("INSERT INTO residue_src VALUES (:v)", {"v": f"met {ZOE}"}),
        ("CREATE MATERIALIZED VIEW residue_report AS SELECT body FROM residue_src", {}),
        ("DELETE FROM residue_src", {}),
        drop="DROP MATERIALIZED VIEW residue_report; DROP TABLE residue_src",
    ):
        assert residue_found(kernel, ZOE, "residue_report.body row ")


@pg_only
def test_a_relation_renamed_under_the_scan_is_named_not_read(
    kernel: Uprof, backend: Backend
) -> None:
    """OZ, the reads of every listed relation: one renamed by another connection after
    the listing and before its read (an operator's, an upgrade's DDL; likewise one in a
    schema the deployment's role may not read, as an extension's can be) failed the whole
    scan with the driver's error (a 500 from the console, no report). It is now an
    ``unscanned`` finding naming it: the report is not clean, and everything else is
    still read (the planted name in another table is found)."""
    engine = kernel.views_engine
    other = sa.create_engine(backend.url, poolclass=sa.pool.NullPool)

    def rename(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if '"residue_moving"' in statement and "ctid" in statement:
            with other.begin() as c:
                c.exec_driver_sql("ALTER TABLE residue_moving RENAME TO residue_moved")

    with _planted(
        kernel,
        ("CREATE TABLE residue_moving (body text)", {}),
        ("CREATE TABLE residue_planted (body text)", {}),
        ("INSERT INTO residue_planted VALUES (:v)", {"v": f"met {ZOE}"}),
        drop="DROP TABLE IF EXISTS residue_moving, residue_moved, residue_planted",
    ):
        sa.event.listen(engine, "before_cursor_execute", rename)
        try:
            report = kernel.residue_scan([ZOE])
        finally:
            sa.event.remove(engine, "before_cursor_execute", rename)
            other.dispose()
    unscanned = [f for f in report.findings if f.kind == "unscanned"]
    assert [f.location for f in unscanned] == ["residue_moving"], report.findings
    assert "cannot read" in unscanned[0].detail and not report.clean
    assert [f for f in report.findings if f.location.startswith("residue_planted.body row ")]


# --- PA: PostgreSQL values the scan read as nothing -----------------------------------------


@pg_only
@pytest.mark.parametrize(
    ("column_type", "literal"),
    [
        ("bytea[]", "ARRAY[CAST(:v AS bytea)]"),  # PA: a list of bytes
        ("bytea[][]", "ARRAY[ARRAY[CAST(:v AS bytea)]]"),  # PA
        ("residue_blob", "CAST(:v AS bytea)"),  # PA: a domain over bytea, read as hex text
    ],
)
def test_bytes_in_an_array_or_a_domain_are_scanned(
    kernel: Uprof, column_type: str, literal: str
) -> None:
    """PA: the scan chose "read as bytes" from SQLAlchemy's type name; a bytea array came
    back as a Python list, which the matcher holds to contain no text, and a domain over
    bytea was cast to text, i.e. ``\\x5a6f..`` hex: the term was in neither."""
    with _planted(
        kernel,
        ("CREATE DOMAIN residue_blob AS bytea", {}),
        (f"CREATE TABLE residue_planted (v {column_type})", {}),
        (f"INSERT INTO residue_planted VALUES ({literal})", {"v": f"met {ZOE}".encode()}),
        drop="DROP TABLE residue_planted; DROP DOMAIN residue_blob",
    ):
        assert residue_found(kernel, ZOE, "residue_planted.v row ")


@pg_only
@pytest.mark.parametrize(
    ("column_type", "value"),
    [
        ("text", f"{ZOE} " + "x" * 300_000),  # TOAST-ed (compressed, out of line)
        ("text[]", [ZOE, 'and "quoted"']),  # an array printed as text
        ("jsonb", json.dumps({"note": [ZOE, {"who": ZOE}]})),  # binary, printed as UTF-8
        ("bytea", ZOE.encode("utf-16-le")),  # UTF-16 in bytea
    ],
)
def test_held_postgres_values_are_read_as_text(kernel: Uprof, column_type: str, value: Any) -> None:
    """Held: TOAST-ed text, a text array, a jsonb document and UTF-16-LE in bytea are
    found (the cast to text detoasts and prints jsonb and arrays as UTF-8)."""
    given = {"text[]": "text[]", "bytea": "bytea"}.get(column_type, "text")
    with _planted(
        kernel,
        (f"CREATE TABLE residue_planted (v {column_type})", {}),
        (
            f"INSERT INTO residue_planted VALUES (CAST(CAST(:v AS {given}) AS {column_type}))",
            {"v": value},
        ),
        drop="DROP TABLE residue_planted",
    ):
        assert residue_found(kernel, ZOE, "residue_planted.v row ")


# --- PB: spellings the needles left out --------------------------------------------------------


def _percent(text: str) -> bytes:
    return urllib.parse.quote(text, safe="").encode()


def _form(text: str) -> bytes:
    return urllib.parse.quote_plus(text).encode()


@pytest.mark.parametrize(
    ("spelled", "data"),
    [
        ("utf-16-be", ("met " + ZOE).encode("utf-16-be")),
        ("utf-16 with BOM", ("met " + ZOE).encode("utf-16")),  # held: LE on this machine
        ("percent", b"GET /v1/search?q=" + _percent(ZOE) + b" 200"),
        ("form", b"POST name=" + _form(ZOE) + b"&x=1"),
        ("percent, upper-case hex", b"/x?q=" + _percent(ZOE).upper()),
    ],
)
def test_a_term_encoded_in_a_file_is_found(kernel: Uprof, spelled: str, data: bytes) -> None:
    """PB: needles were UTF-8, UTF-16-LE and JSON only. UTF-16-BE (Java's "UTF-16", a
    big-endian export) spells "Š" 01 60 where LE spells 60 01; a URL in an access log
    or a stored link spells the name as percent escapes (%C5%A0imkov%C3%A1, a space as
    %20 or +): text any reader decodes at sight, and the audit said clean."""
    plant_file(kernel, "access.log", data)
    assert residue_found(kernel, ZOE, "access.log@"), spelled


def test_a_term_utf16be_in_a_sqlite_blob_is_found(kernel: Uprof) -> None:
    """PB, in a table of a SQLite file the audit reads (the logical pass)."""
    path = kernel.settings.data_dir / "exports" / "copy.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE blobs (b BLOB)")
    conn.execute("INSERT INTO blobs VALUES (?)", (ZOE.encode("utf-16-be"),))
    conn.commit()
    conn.close()
    assert residue_found(kernel, ZOE, "copy.sqlite table blobs.b row 0")


@pg_only
@pytest.mark.parametrize(
    ("column_type", "value"),
    [
        ("bytea", ZOE.encode("utf-16-be")),
        ("text", f"https://example.invalid/p?name={_percent(ZOE).decode()}"),
    ],
)
def test_a_term_encoded_in_a_postgres_column_is_found(
    kernel: Uprof, column_type: str, value: Any
) -> None:
    """PB, in PostgreSQL: UTF-16-BE bytes in bytea, a stored link with the name in it."""
    with _planted(
        kernel,
        (f"CREATE TABLE residue_planted (v {column_type})", {}),
        (f"INSERT INTO residue_planted VALUES (CAST(:v AS {column_type}))", {"v": value}),
        drop="DROP TABLE residue_planted",
    ):
        assert residue_found(kernel, ZOE, "residue_planted.v row ")


def test_an_encoded_term_across_a_chunk_border_is_found(kernel: Uprof) -> None:
    """PB across the file scan's 1 MiB chunk border: a percent-escaped and a UTF-16-BE
    name starting a few bytes before it are found at their offsets (the chunks overlap
    by the longest needle, so the longer percent needle is covered too)."""
    for data in (_percent(ZOE), ZOE.encode("utf-16-be")):
        head = b"y" * (CHUNK - 7)
        plant_file(kernel, "border.bin", head + data + b"z" * 50)
        assert residue_found(kernel, ZOE, f"border.bin@{len(head)}"), data


def test_held_base64_is_not_searched(kernel: Uprof) -> None:
    """Held as documented (docs/governance.md): base64 is not decoded. Its spelling of a
    name depends on the name's offset in the encoded bytes (three spellings, each missing
    up to two letters at each end) and on the bytes beside it; the audit's finding would
    be a guess. The test pins the behaviour an auditor is told about."""
    plant_file(kernel, "blob.txt", base64.b64encode(f"met {ZOE} today".encode()))
    assert not residue_found(kernel, ZOE, "blob.txt@")


# --- SQLite: what only a journal holds --------------------------------------------------------


def test_held_a_term_only_in_a_persisted_rollback_journal_is_found(kernel: Uprof) -> None:
    """Held: a SQLite file an operator's tool keeps in ``journal_mode=PERSIST`` with
    ``secure_delete`` on: the deleted name is zeroed in the main file, and the journal
    (not deleted at commit) keeps the page as it was. The raw pass reads the journal."""
    path = kernel.settings.data_dir / "exports" / "tool.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=PERSIST")
    conn.execute("PRAGMA secure_delete=ON")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES (?)", (f"met {ZOE}",))
    conn.execute("DELETE FROM notes")
    conn.close()
    assert ZOE.encode() not in path.read_bytes()
    assert ZOE.encode() in path.with_name("tool.db-journal").read_bytes()
    found = residue_found(kernel, ZOE, "tool.db")
    assert found and all("tool.db-journal@" in where for where in found), found


# --- concurrency: a real process erases while the PostgreSQL scan is between tables --------

ERASER = """
import sys
from pathlib import Path
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, say
from uprof.settings import Settings
settings = Settings(data_dir=Path(sys.argv[1]), database_url=sys.argv[2], embedder="hashing")
with running(settings, FakeClock()) as k:
    k.capture("person-2", say("written beside the scan", ref="w-beside"))
    k.erase_subject("person-1")
print("done", flush=True)
"""


def _seeded(kernel: Uprof, subjects: int, each: int) -> None:
    for s in range(subjects):
        subject = f"person-{s}"
        consent(kernel, subject)
        kernel.capture_many(
            subject, [say(f"Qzxcity{s} visit {i}", ref=f"r{i}") for i in range(each)]
        )
    kernel.process()


@pg_only
def test_held_an_erasure_in_another_process_finishes_while_the_scan_is_paused(
    kernel: Uprof, backend: Backend
) -> None:
    """Held: the table scan stopped before its fourth table's read; a real process
    captures and erases a subject (its deletes on every view table, its key shredding)
    and finishes before the scan goes on; the scan then completes with no error, and
    a scan after it finds the erased subject's stream fully checked and nothing left."""
    _seeded(kernel, subjects=3, each=3)
    run_beside_a_paused_scan(kernel, backend, ERASER)
    report = kernel.residue_scan(["Qzxcity1"])
    assert report.streams_checked == 1
    assert not [f for f in report.findings if f.kind != "plaintext"], report.findings


# --- PC: the cost of terms -------------------------------------------------------------------


def test_a_term_longer_than_the_cap_is_refused_naming_it(kernel: Uprof) -> None:
    """PC: the door capped the number of terms (100) but not their length. A term's
    needles (4 normal forms x its cases x 7 encodings) are compiled into the scan's
    patterns, in the child and, on PostgreSQL, in the server's own process: 100 terms of
    3,000 Greek letters took 24.5 s of CPU and 2.3 GB to compile, a term of a million
    characters (the console's form takes one) exhausts memory. Refused now before
    anything is read, naming ``terms`` and its place; a term at the cap is looked for."""
    from domain.errors import InvalidInputError
    from domain.principal import Principal
    from uprof.facade import MAX_RESIDUE_TERM_CHARS, Facade

    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    longest = ("Σωκράτης " * MAX_RESIDUE_TERM_CHARS)[:MAX_RESIDUE_TERM_CHARS]
    assert door.residue_scan(["Zq7-never-said", longest]).clean
    with pytest.raises(InvalidInputError) as refused:
        door.residue_scan(["Zq7-never-said", longest + "x"])
    assert refused.value.field == "terms"
    assert "terms[1]" in str(refused.value) and str(MAX_RESIDUE_TERM_CHARS) in str(refused.value)


def test_the_trie_pattern_finds_what_each_needle_finds() -> None:
    """Held (PC's trie of needles, against a search for each needle): over random
    needle sets, prefixes of each other, and texts, the first offset the combined
    pattern finds is the least offset of any needle; also past ``TRIE_DEPTH``
    branchings, where the rest of the trie is written flat."""
    import random
    import re

    from uprof.services import residue_files

    rng = random.Random(187)
    for depth in (residue_files.TRIE_DEPTH, 1):
        for _ in range(1_500):
            needles = {
                bytes(rng.choice(b"abc") for _ in range(rng.randint(1, 6)))
                for _ in range(rng.randint(1, 12))
            }
            compiled = re.compile(residue_files._any_of(needles, depth))
            for _ in range(4):
                text = bytes(rng.choice(b"abcd") for _ in range(rng.randint(0, 30)))
                least = min((text.find(n) for n in needles if n in text), default=None)
                found = compiled.search(text)
                assert (None if found is None else found.start()) == least, (needles, text)
    # A path of 300 branchings (terms "xa", "xxa", ...) compiles: re recursed past its stack.
    deep = re.compile(residue_files._any_of(b"x" * i + b"a" for i in range(1, 300)))
    assert deep.search(b"x" * 250 + b"a") and not deep.search(b"x" * 400)


def test_the_matcher_gives_what_a_search_for_each_needle_gives() -> None:
    """Held (PC's candidates by prefix, then whole needles): over random terms of a few
    letters, some outside ASCII, and texts in UTF-8 and UTF-16 either way, the matcher's
    terms and first offsets equal a search for each needle, with prefixes of 1, 2, 3 and
    16 bytes (a short prefix makes most positions candidates that the whole needle
    refuses)."""
    import random

    from uprof.services.residue_files import Matcher

    rng = random.Random(1870)
    letters = "abcAB ëË"
    for _ in range(2_000):
        terms = list(
            {
                "".join(rng.choice(letters) for _ in range(rng.randint(1, 7))).strip() or "a"
                for _ in range(rng.randint(1, 6))
            }
        )
        matcher = Matcher(terms, rng.choice([1, 2, 3, 16]))
        for _ in range(4):
            text = "".join(rng.choice(letters + "xyz") for _ in range(rng.randint(0, 40)))
            data = text.encode(rng.choice(["utf-8", "utf-16-le", "utf-16-be"]))
            folded, least = data.lower(), {}
            for term, needle in matcher.needles:
                at = folded.find(needle)
                if at >= 0 and at < least.get(term, len(folded)):
                    least[term] = at
            assert matcher.first_offsets(data) == least, (terms, data)
            assert matcher.terms_in(data) == sorted(least), (terms, data)


# --- concurrency: scans beside a process that captures, erases and rebuilds -----------------

CHURNER = """
import sys
from pathlib import Path
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, say
from uprof.settings import Settings
folder, url, marks = Path(sys.argv[1]), sys.argv[2] or None, Path(sys.argv[3])
settings = Settings(data_dir=folder, database_url=url, embedder="hashing")
with running(settings, FakeClock()) as k:
    i = 0
    while not (marks / "stop").exists():
        subject = f"churn-{i}"
        consent(k, subject)
        k.capture(subject, say(f"Qzxcity0 visit by a living subject {i}", ref=f"c{i}"))
        k.process()
        k.erase_subject(subject)
        k.rebuild()
        i += 1
        (marks / "rounds").write_text(str(i))
"""


def test_held_scans_beside_a_process_that_captures_erases_and_rebuilds(
    kernel: Uprof, backend: Backend, tmp_path: Path
) -> None:
    """Held, both backends: a real process captures a subject's words, erases the subject
    and rebuilds every view, round after round, while this process runs whole audits for
    an erased subject's words. Every scan completes; none names the subject erased before
    the scans began (a rebuild that put its rows back, or a torn read of one, would); no
    plaintext is found; the churner's rounds go on while the scans run (its writes are not
    held for a whole scan); and the scan after it stopped is clean. A scan may report rows
    or keys of a subject the churner is erasing at that moment (the key is shredded first,
    the rows deleted after): true when read, gone once that erasure ends, and labelled
    an erasure in progress (decision 0198-residue-in-progress, bug PS);
    and ``unfolded`` beside the rebuild's readers on SQLite, as it must."""
    from tests.children import PythonChild, progress_count
    from tests.kernel.conftest import settings_for

    _seeded(kernel, subjects=2, each=3)
    erased = str(kernel.stream_of("person-0"))
    kernel.erase_subject("person-0")
    url = backend.url if backend.kind == "postgres" else ""
    rounds = tmp_path / "rounds"
    child = PythonChild(CHURNER, str(settings_for(backend).data_dir), url, str(tmp_path))
    reports = []
    try:
        for _ in range(6_000):  # until its first round (a poll, not a time bound)
            if progress_count(rounds) or child.poll() is not None:
                break
            threading.Event().wait(0.05)
        first = progress_count(rounds)
        assert first, "the churner never finished a round"
        while len(reports) < 3 or progress_count(rounds) < first + 3:
            assert child.poll() is None, "the churner stopped"
            reports.append(kernel.residue_scan(["Qzxcity0"]))
            assert len(reports) < 200, "the churner made no progress beside the scans"
    finally:
        (tmp_path / "stop").write_text("")
        _, err = child.communicate(300)
    assert child.returncode == 0, err[-2000:]
    for report in reports:
        assert report.streams_checked >= 1
        assert not [f for f in report.findings if erased in f.location], report.findings
        kinds = {"unfolded", "row", "key", "erasure"}
        assert {f.kind for f in report.findings} <= kinds, report.findings
        # Each a churner's erasure running, and said so (bug PS, decision 0198).
        churning = [f for f in report.findings if f.kind != "unfolded"]
        assert {f.erasure for f in churning} <= {IN_PROGRESS}, report.findings
    assert kernel.residue_scan(["Qzxcity0"]).clean
    assert progress_count(rounds) >= first + 3
    kinds = sorted({f.kind for report in reports for f in report.findings})
    print(f"scans={len(reports)} rounds={progress_count(rounds) - first} kinds={kinds}")
