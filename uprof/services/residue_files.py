"""The byte-level half of the residue audit, run in a child process of its own.

Why a child: SQLite's POSIX advisory locks belong to the process, and closing *any*
descriptor of a database file releases every lock the process holds on it
(FIELD-NOTES 8.1). A server that opened its own ``views.sqlite-shm`` to scan it lost
its locks; the next CLI process took itself for the last connection, checkpointed and
deleted the WAL, and the server's later writes went to a deleted file. Locks are per
process, so whatever this scanner opens and closes cannot touch the locks of the
process that started it. The parent (``residue.scan_files``) never opens a file under
the data folder.

What it reads, per SQLite database found under the root (by name — ``*.sqlite``,
``*.sqlite3``, ``*.db`` and the ``-wal``/``-shm``/``-journal`` siblings — or by the
16-byte header ``SQLite format 3\\0``):

1. a read-only driver connection opens a read transaction first. That snapshot pins
   the WAL: no checkpoint can reset or truncate it while the scan runs, so every
   committed page of the snapshot is in the main file or the WAL while they are read;
2. the raw bytes of the main file and of every sibling, read through descriptors held
   open until the connection is closed (closing one earlier would drop this process's
   own read lock and reopen the race). Raw bytes cover what a logical copy loses: free
   pages, superseded pages, old WAL frames;
3. every column of every ordinary table, read through the same snapshot, so a value
   split across overflow pages (not contiguous in the file) is still found.

Every other file (exports, logs, key files) is read as raw bytes. A term is found however
it is spelled (``needles``: any case, any Unicode normal form, UTF-8, UTF-16-LE or inside
a JSON string); ``Matcher`` is also what the PostgreSQL table scan matches values with.
The protocol is JSON:
``{"root": ..., "terms": [...]}`` on stdin (terms never go on the command line, where
other users could read them), the counts and findings on stdout. Standard library only,
so the child starts fast and runs with ``python -I``.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import sys
import unicodedata
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO

#: Files are read in chunks; a term split across a chunk border is still found.
CHUNK = 1 << 20
SQLITE_MAGIC = b"SQLite format 3\x00"
SIBLINGS = ("-wal", "-shm", "-journal")
DB_SUFFIXES = (".sqlite", ".sqlite3", ".db")
#: Findings per (table, column, term) in the logical pass, as in the PostgreSQL scan.
ROWS_PER_COLUMN = 5


#: At most this many spellings of one term's non-ASCII letters, upper or lower case each,
#: are searched letter by letter; a term with more keeps its uniform spellings (all lower
#: case, all upper case, title case, case-folded) for those letters.
MAX_SPELLINGS = 64


def needles(term: str) -> list[bytes]:
    """Every byte string that spells ``term`` as stored text may hold it, ASCII-lowered.

    The bytes searched go through the same ASCII lowering (``bytes.lower``), so ASCII
    letters match in any case; the term's other letters are spelled in each case
    (``MAX_SPELLINGS``). Each spelling in each Unicode normal form (a name typed on
    one keyboard is NFC, pasted from another NFD; bug OP), each encoded as UTF-8,
    UTF-16 in either byte order (a big-endian export spells "Š" 01 60, little-endian
    60 01; bug PB), inside a JSON string, escaped as ``json.dumps`` writes it by default
    (``\\u00eb``; bug OR) and with ``ensure_ascii=False`` (quotes, backslashes, controls),
    and percent-escaped as in a URL (``Zo%C3%AB%20``, or ``+`` for a space in a form or
    query string: an access log's request line, a stored link; bug PB).
    """
    forms = {unicodedata.normalize(form, term) for form in ("NFC", "NFD", "NFKC", "NFKD")}
    found: set[bytes] = set()
    for form in forms:
        for spelling in _spellings(form):
            for data in (
                spelling.encode("utf-8", "surrogatepass"),
                spelling.encode("utf-16-le", "surrogatepass"),
                spelling.encode("utf-16-be", "surrogatepass"),
                json.dumps(spelling)[1:-1].encode("ascii"),
                json.dumps(spelling, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass"),
                urllib.parse.quote(spelling, safe="", errors="surrogatepass").encode("ascii"),
                urllib.parse.quote_plus(spelling, errors="surrogatepass").encode("ascii"),
            ):
                if data:
                    found.add(data.lower())
    return sorted(found)


def _spellings(form: str) -> set[str]:
    """``form`` in uniform cases, and letter by letter in each case (bug OP) when few."""
    uniform = {form, form.lower(), form.upper(), form.title(), form.casefold()}
    letters = [
        [c] if c.isascii() else sorted({c, c.lower(), c.upper(), c.casefold()}) for c in form
    ]
    count = 1
    for choices in letters:
        count *= len(choices)
        if count > MAX_SPELLINGS:
            return uniform
    return uniform | {"".join(p) for p in itertools.product(*letters)}


#: The one compiled pattern holds each needle's first ``PREFIX`` bytes only; where it
#: matches, the whole needles that start so are compared there. Compiling costs about a
#: microsecond and 200 bytes of memory per pattern byte (``re`` parses in Python): all of
#: every needle, 100 terms of 200 Greek letters (the door's caps), 1.1 s and 132 MB on
#: main's needles, 5.8 s and 671 MB with the encodings bug PB added; 0.1 s and 24 MB so.
PREFIX = 16


class Matcher:
    """Which of the terms a value holds, in any of their ``needles``."""

    def __init__(self, terms: Sequence[str], prefix: int = PREFIX) -> None:
        self.needles = [(term, n) for term in dict.fromkeys(terms) for n in needles(term)]
        self.overlap = max((len(n) for _, n in self.needles), default=1)
        self._terms = len({term for term, _ in self.needles})
        #: Needles by their first ``prefix`` bytes (a shorter needle: by itself).
        self._starting: dict[bytes, list[tuple[str, bytes]]] = {}
        for term, needle in self.needles:
            self._starting.setdefault(needle[:prefix], []).append((term, needle))
        self._lengths = sorted({len(start) for start in self._starting})
        #: Does a value hold a candidate at all: one pass, the starts factored as a trie
        #: (bug PC). A flat alternation of the needles made ``re`` try every needle at
        #: every byte: at 100 terms with letters outside ASCII, 0.58 s of CPU per MiB.
        self._any = re.compile(_any_of(self._starting))

    def _found(self, folded: bytes) -> Iterator[tuple[int, str]]:
        """(offset, term) of every needle in ``folded``, by offset (a term may repeat)."""
        candidate = self._any.search(folded)
        while candidate is not None:
            at = candidate.start()
            for length in self._lengths:
                for term, needle in self._starting.get(folded[at : at + length], ()):
                    if folded.startswith(needle, at):
                        yield at, term
            candidate = self._any.search(folded, at + 1)  # needles may overlap

    def terms_in(self, value: object) -> list[str]:
        """The terms found in a column's value: text, bytes, or an array of them
        (PostgreSQL's ``bytea[]`` arrives as nested lists; bug PA)."""
        if isinstance(value, list | tuple):
            return sorted({term for item in value for term in self.terms_in(item)})
        data = _as_bytes(value)
        if data is None:
            return []
        found: set[str] = set()
        for _, term in self._found(data.lower()):
            found.add(term)
            if len(found) == self._terms:
                break
        return sorted(found)

    def first_offsets(self, window: bytes) -> dict[str, int]:
        """Each term found in ``window`` (raw bytes) with the offset of its first needle."""
        first: dict[str, int] = {}
        for at, term in self._found(window.lower()):
            first.setdefault(term, at)
            if len(first) == self._terms:
                break
        return first


#: Past this many branchings down one path of the trie, ``_any_of`` writes the rest of
#: that subtree as a flat alternation: ``re`` compiles a nested group by recursion, and
#: about 200 levels of ``(?:a|b(?:..))`` exhaust Python's stack (RecursionError).
TRIE_DEPTH = 64
_END = -1


def _any_of(needles: Iterable[bytes], limit: int = TRIE_DEPTH) -> bytes:
    """A pattern matching any of ``needles`` where it starts: their trie as nested groups.

    A needle that extends a shorter one is dropped (finding the shorter is the answer).
    At each branching ``re`` tests one byte per branch, so the cost of a position is the
    depth walked, not the number of needles.
    """
    root: dict[int, Any] = {}
    for needle in sorted(set(needles), key=len):
        node = root
        for byte in needle:
            if _END in node:
                break  # a shorter needle ends here
            node = node.setdefault(byte, {})
        else:
            node.clear()
            node[_END] = {}
    return _trie(root, limit) if root else b"(?!)"


def _trie(node: dict[int, Any], limit: int) -> bytes:
    run = bytearray()
    while _END not in node and len(node) == 1:
        ((byte, node),) = node.items()
        run.append(byte)
    head = re.escape(bytes(run))
    if _END in node:
        return head
    if limit <= 0:
        branches = [re.escape(tail) for tail in _tails(node)]
    else:
        branches = [re.escape(bytes([b])) + _trie(child, limit - 1) for b, child in node.items()]
    return head + b"(?:" + b"|".join(branches) + b")"


def _tails(node: dict[int, Any]) -> Iterator[bytes]:
    """Every needle's remainder below ``node``, without recursion."""
    stack: list[tuple[bytes, dict[int, Any]]] = [(b"", node)]
    while stack:
        prefix, at = stack.pop()
        for byte, child in at.items():
            if byte == _END:
                yield prefix
            else:
                stack.append((prefix + bytes([byte]), child))


class _Scan:
    def __init__(self, terms: Sequence[str]) -> None:
        self.matcher = Matcher(terms)
        self.findings: list[dict[str, str]] = []
        self.files_scanned = 0
        self.bytes_scanned = 0
        self.tables_scanned = 0
        self.databases = 0

    def find(self, kind: str, location: str, detail: str) -> None:
        self.findings.append({"kind": kind, "location": location, "detail": detail})

    def raw(self, path: Path, fh: BinaryIO) -> None:
        self.files_scanned += 1
        fh.seek(0)
        offset = 0
        tail = b""
        while chunk := fh.read(CHUNK):
            window = tail + chunk
            base = offset - len(tail)
            for term, at in self.matcher.first_offsets(window).items():
                self.find("plaintext", f"{path}@{base + at}", f"term {term!r}")
            offset += len(chunk)
            self.bytes_scanned += len(chunk)
            tail = window[-self.matcher.overlap :]

    def logical(self, path: Path, conn: sqlite3.Connection) -> None:
        tables = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND coalesce(sql, '') NOT LIKE 'CREATE VIRTUAL TABLE%' ORDER BY name"
        ).fetchall()
        for (table,) in tables:
            self.tables_scanned += 1
            quoted = '"' + table.replace('"', '""') + '"'
            cursor = conn.execute(f"SELECT * FROM {quoted}")  # the name comes from the schema
            columns = [d[0] for d in cursor.description]
            hits: dict[tuple[str, str], int] = {}
            for row_number, row in enumerate(cursor):
                for column, value in zip(columns, row, strict=True):
                    for term in self.matcher.terms_in(value):
                        key = (column, term)
                        if hits.get(key, 0) < ROWS_PER_COLUMN:
                            hits[key] = hits.get(key, 0) + 1
                            self.find(
                                "plaintext",
                                f"{path} table {table}.{column} row {row_number}",
                                f"term {term!r}",
                            )


def _as_bytes(value: object) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return None


def _database_of(path: Path) -> Path | None:
    """The main database a file belongs to, by name; None if its name says nothing."""
    for suffix in SIBLINGS:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            return path.with_name(path.name[: -len(suffix)])
    return path if path.suffix.lower() in DB_SUFFIXES else None


def _open(path: Path, scan: _Scan) -> BinaryIO | None:
    try:
        return path.open("rb")
    except FileNotFoundError:
        return None  # gone since the listing (a -journal at commit): nothing left to read
    except OSError as e:
        scan.find("unscanned", str(path), f"cannot read: {e.strerror or e}")
        return None


def scan_tree(root: Path, terms: Sequence[str]) -> dict[str, Any]:
    scan = _Scan(terms)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    databases: dict[Path, list[Path]] = {}
    with ExitStack() as held:  # database descriptors stay open until their snapshot ends
        opened: dict[Path, BinaryIO] = {}
        for path in files:
            main = _database_of(path)
            if main is None:
                fh = _open(path, scan)
                if fh is None:
                    continue
                if fh.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                    with fh:
                        scan.raw(path, fh)
                    continue
                opened[path] = held.enter_context(fh)
                main = path
            databases.setdefault(main, []).append(path)
        for main, members in databases.items():
            with ExitStack() as snapshot:
                head = _held(main, opened, held, scan)
                conn = _read_snapshot(main, head, scan)
                if conn is not None:
                    snapshot.callback(conn.close)  # runs before the descriptors close
                for path in sorted(set(members) | {main}, key=lambda p: (p != main, p.name)):
                    if path not in opened:
                        _held(path, opened, held, scan)
                    if path in opened:
                        scan.raw(path, opened[path])
                if conn is not None:
                    scan.logical(main, conn)
    return {
        "findings": scan.findings,
        "files_scanned": scan.files_scanned,
        "bytes_scanned": scan.bytes_scanned,
        "tables_scanned": scan.tables_scanned,
        "databases": len(databases),
    }


def _held(path: Path, opened: dict[Path, BinaryIO], held: ExitStack, scan: _Scan) -> bytes:
    """Open a database file for the rest of the scan; its first 16 bytes (b"" if none)."""
    if path not in opened:
        fh = _open(path, scan)
        if fh is None:
            return b""
        opened[path] = held.enter_context(fh)
    fh = opened[path]
    fh.seek(0)
    return fh.read(len(SQLITE_MAGIC))


def _read_snapshot(main: Path, head: bytes, scan: _Scan) -> sqlite3.Connection | None:
    """A read-only connection inside a read transaction; None if the file is no database.

    Read-only, so closing it never checkpoints or deletes a WAL, even when it is the
    last connection (a copy of a data folder is scanned without being changed).
    """
    if head != SQLITE_MAGIC:
        return None  # an orphan -wal/-shm, an empty or foreign file: scanned raw only
    conn = sqlite3.connect(
        f"{main.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None, timeout=30
    )
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        conn.close()
        scan.find("unscanned", str(main), f"no consistent snapshot: {e}")
        return None
    return conn


def main() -> None:
    request = json.load(sys.stdin)
    result = scan_tree(Path(request["root"]), list(request["terms"]))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
