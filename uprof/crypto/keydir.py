"""The key folder: the default ``KeyMaterialStore``, kept apart from the data folder.

Layout of ``UPROF_KEY_DIR`` (mode 0700, files 0600)::

    master.key             root secret (lookup keys, pseudonym and ledger marks)
    keks.json              the KEK ring (wraps every subject data key)
    keks.lock              empty; its flock orders wrapping new keys and KEK rotation
    audit-signing.pem      the audit log's current Ed25519 signing key
    audit-keys.json        the audit key history: every public key, each endorsed by the
                           one before (audit.keyring; public, published to verifiers)
    audit-keys.lock        empty; its flock orders audit key rotations
    erasure-ledger.jsonl   append-only: every erasure, by stream id and keyed hash
    keys.sqlite            SQLite deployments: the wrapped data keys (storage.py)

Nothing here is personal data; all of it is needed to read the data. A copy of
the data folder without this folder opens nothing (decision 0012).

Files are created so that two processes starting together end up with the same
secret: written to a private temporary file, then hard-linked into place; the
loser of the race reads the winner's file.
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import socket
import sqlite3
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit.keyring import FileKeyRing
from audit.lockfile import (
    LockFileAccessError,
    make_key_folder,
    make_lock_folder,
    open_key_file,
    open_lock_file,
    read_key_file,
)
from domain.errors import DeploymentNotFoundError, UprofError
from uprof.ports import ErasureRecord

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

MASTER_KEY_FILE = "master.key"
KEK_RING_FILE = "keks.json"
RING_LOCK_FILE = "keks.lock"
AUDIT_KEY_FILE = "audit-signing.pem"
LEDGER_FILE = "erasure-ledger.jsonl"
#: One lock file per erasure request between its ``erasure.requested`` entry and its
#: ledger record (``erasure_in_flight``), held with ``flock`` by its process.
IN_FLIGHT_DIR = "erasures-in-flight"
#: Where the start's sweep for open erasure requests may begin (``settled_mark``).
SETTLED_MARK_FILE = "erasures-settled-upto.json"
#: Held (``flock``) by an operator's ``uprof erase settle-host`` run for its whole run
#: (``settle_host_turn``): runs take turns instead of taking each other's hold on a mark
#: for a live host's (bug JW).
SETTLE_HOST_LOCK_FILE = "erasures-settle-host.lock"
#: A finished one-off data upgrade: ``upgraded.<name>`` (``record_data_upgrade``).
UPGRADE_FILE_PREFIX = "upgraded."
KEYS_DB_FILE = "keys.sqlite"
#: Key material an older uprof kept inside the data folder.
LEGACY_FILES = (MASTER_KEY_FILE, KEK_RING_FILE, AUDIT_KEY_FILE, KEYS_DB_FILE)

_log = logging.getLogger(__name__)
_REQUEST_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _host_line() -> bytes:
    """What an in-flight mark says of its host (``erasure_in_flight``)."""
    return f"host={socket.gethostname()}\n".encode()


class KeyMaterialError(UprofError):
    """The key folder is misplaced, unreadable or holds something unexpected."""

    hint = "key material lives in UPROF_KEY_DIR, apart from UPROF_DATA_DIR (docs/governance.md)"


class KeyFolderNotFoundError(KeyMaterialError, DeploymentNotFoundError):
    """A deployment's data found with a key folder that holds no master key: a mistyped
    ``UPROF_KEY_DIR``/``--key-dir`` (on PostgreSQL, another working directory), or data
    restored without its keys. The wrong place, as a data folder holding no deployment is
    (exit 8; decision 0242-the-wrong-folder-2, bug XD): new keys there would leave every
    key the data was written under behind."""

    hint = (
        "name the deployment's key folder (--key-dir, UPROF_KEY_DIR), or restore it with "
        "the data (docs/governance.md); nothing was made in the folder named"
    )


def _upgrade_file(name: str) -> str:
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"data upgrade name {name!r}: letters, digits, '-', '_', '.' only")
    return UPGRADE_FILE_PREFIX + name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_once(path: Path, data: bytes) -> bytes:
    """Write ``data`` at ``path`` unless it exists; return what is there afterwards."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return read_key_file(path)  # another process won the race
        except FileNotFoundError:
            if not path.exists():
                raise
            return read_key_file(path)  # won, and a ring write cleared our file meanwhile
        _fsync_dir(path.parent)
        return data
    finally:
        tmp.unlink(missing_ok=True)


#: Record kinds this version reads (``ErasureRecord``); a line of another kind is skipped.
LEDGER_KINDS = frozenset({"subject", "captures", "items", "recreated", "incomplete", "receipted"})


def _record_to_json(record: ErasureRecord) -> str:
    body: dict[str, object] = {
        "v": 1,
        "kind": record.kind,
        "tenant": record.tenant,
        "at": record.at,
    }
    if record.stream_id is not None:
        body["stream_id"] = record.stream_id
    if record.mark is not None:
        body["mark"] = record.mark
    if record.capture_ids:
        body["capture_ids"] = list(record.capture_ids)
    if record.item_ids:
        body["item_ids"] = list(record.item_ids)
    if record.fingerprints:
        body["fingerprints"] = list(record.fingerprints)
    if record.request_id:
        body["request_id"] = record.request_id
    if record.draft:
        body["draft"] = record.draft
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _record_from_json(line: str) -> ErasureRecord:
    raw = json.loads(line)
    if raw.get("v") != 1 or raw.get("kind") not in LEDGER_KINDS:
        raise ValueError("not a ledger record")
    return ErasureRecord(
        kind=raw["kind"],
        tenant=str(raw["tenant"]),
        at=str(raw["at"]),
        stream_id=raw.get("stream_id"),
        mark=raw.get("mark"),
        capture_ids=tuple(raw.get("capture_ids", ())),
        item_ids=tuple(raw.get("item_ids", ())),
        fingerprints=tuple(raw.get("fingerprints", ())),
        request_id=str(raw.get("request_id", "")),
        draft=str(raw.get("draft", "")),
    )


def _locked_mark(path: Path, *, blocking: bool) -> int | None:
    """A descriptor of the erasure mark ``path``, opened through the checked opener and
    flocked; None when not ``blocking`` and a live process holds it. A lock taken on a
    file ``path`` no longer names (its holder ended the request and removed it between
    this open and this lock) marks nothing: it is let go and the mark opened again. It
    was kept, and a process holding a removed file ran beside the one that made a new
    mark, finishing the same request at once (bug QI)."""
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        mine = os.fstat(fd)
        try:
            there = os.lstat(path)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)


class FileKeyMaterialStore:
    """Key material as files in one folder (the default ``KeyMaterialStore``)."""

    def __init__(self, key_dir: Path, *, master_secret: bytes | None = None) -> None:
        self.path = key_dir
        self.location = str(key_dir)
        self._master_override = master_secret
        # Owner, mode and no link checked before any key is read or written (bug PR): a
        # folder others may write lets them plant or swap the keys erasure depends on.
        make_key_folder(key_dir)
        self._ledger_lock = threading.Lock()
        self._audit_keys: FileKeyRing | None = None
        self._records: list[ErasureRecord] = []
        self._snapshot: tuple[ErasureRecord, ...] | None = ()
        #: (inode, bytes consumed) of the ledger file read so far.
        self._ledger_state: tuple[int, int] = (0, 0)

    # --------------------------------------------------------------- secrets

    def master_secret(self) -> bytes:
        if self._master_override is not None:
            return self._master_override
        path = self.path / MASTER_KEY_FILE
        try:
            data = read_key_file(path)
        except FileNotFoundError:
            data = _create_once(path, secrets.token_bytes(32))
        if len(data) < 32:
            raise KeyMaterialError(f"{path} is shorter than 32 bytes; refusing to start")
        return data

    def has_master_secret(self) -> bool:
        return self._master_override is not None or (self.path / MASTER_KEY_FILE).exists()

    def load_kek_ring(self) -> dict[int, bytes]:
        path = self.path / KEK_RING_FILE
        try:
            ring = read_key_file(path)
        except FileNotFoundError:
            first = {1: AESGCM.generate_key(bit_length=256)}
            ring = _create_once(path, self._ring_bytes(first))
        raw = json.loads(ring.decode("utf-8"))
        return {int(e["epoch"]): base64.b64decode(e["key"]) for e in raw["keks"]}

    def save_kek_ring(self, keys: dict[int, bytes]) -> None:
        path = self.path / KEK_RING_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self._ring_bytes(keys))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        # A rotation killed between its write and its rename left its temporary file:
        # every KEK of the ring it was writing, old epochs included, which no later
        # rotation would forget. Every ring write holds the exclusive ring lock, so no
        # other writer is between the two now (a first start's ``_create_once`` of the
        # ring runs only while there is none, and gives way if it finds one).
        for leftover in self.path.glob(f".{path.name}.*.tmp"):
            leftover.unlink(missing_ok=True)
        _fsync_dir(self.path)

    @contextmanager
    def ring_lock(self, *, exclusive: bool) -> Iterator[None]:
        # A flock of a file of its own: every process (and thread: each opens its own
        # descriptor) of the deployment shares this folder. Checked (bug PP): a link
        # planted here made this create a file elsewhere, and another user's file let
        # that user hold every KEK rotation and key wrap.
        fd = open_lock_file(self.path / RING_LOCK_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the flock

    @staticmethod
    def _ring_bytes(keys: dict[int, bytes]) -> bytes:
        body = {
            "keks": [
                {"epoch": epoch, "key": base64.b64encode(key).decode()}
                for epoch, key in sorted(keys.items())
            ]
        }
        return json.dumps(body).encode()

    def data_upgraded(self, name: str) -> bool:
        return (self.path / _upgrade_file(name)).exists()

    def record_data_upgrade(self, name: str) -> None:
        stamp = datetime.now(UTC).isoformat().encode()
        _create_once(self.path / _upgrade_file(name), stamp)

    def forget_data_upgrade(self, name: str) -> None:
        path = self.path / _upgrade_file(name)
        if path.exists():
            path.unlink(missing_ok=True)
            _fsync_dir(self.path)

    def audit_keys(self) -> FileKeyRing:
        """The audit key ring of this folder: the current key and its endorsed history."""
        if self._audit_keys is None:
            self._audit_keys = FileKeyRing(self.path)
        return self._audit_keys

    def audit_signing_key(self) -> Ed25519PrivateKey:
        return self.audit_keys().current()

    # ------------------------------------------------------ erasures in flight

    def _in_flight_path(self, request_id: str) -> Path:
        if not _REQUEST_ID.fullmatch(request_id):
            raise ValueError("not an erasure request id")
        return self.path / IN_FLIGHT_DIR / f"{request_id}.lock"

    @contextmanager
    def erasure_in_flight(self, request_id: str) -> Iterator[None]:
        # An flock dies with its process (SIGKILL included): a lock file nobody holds
        # is a request whose process is gone (``erasure_owner_gone``). It names its
        # host: only a start on that host can tell (bug HY).
        path = self._in_flight_path(request_id)
        # Checked, folder and file (bug PP): a link as either made this write its host
        # line into the file it names, anywhere; a link as the folder put the marks there.
        make_lock_folder(path.parent)
        fd = _locked_mark(path, blocking=True)
        assert fd is not None  # a blocking lock is always taken
        try:
            try:
                os.write(fd, _host_line())
                yield
            finally:
                # Ended in this process, done, refused or failed (its outcome is written
                # inside the block): no mark left behind. Only a dead process leaves one.
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    @contextmanager
    def erasure_finishing(self, request_id: str) -> Iterator[bool]:
        # A process finishing a request begun elsewhere (asked again after its process
        # died past its ledger record, or while it runs): the request's mark, taken
        # without waiting; False when a live process holds it (that one is finishing it
        # too, and its mark says so). Taken, it names this host and goes at the end.
        path = self._in_flight_path(request_id)
        # The same mark as ``erasure_in_flight``'s, checked the same way (bug QA: opened
        # by its own ``os.open``, a hard link's file was emptied and written, another
        # user's file taken as the mark, a FIFO or a folder failed with a traceback).
        make_lock_folder(path.parent)
        fd = _locked_mark(path, blocking=False)
        if fd is None:
            yield False
            return
        try:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, _host_line(), 0)
                yield True
            finally:
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def erasure_mark_state(self, request_id: str) -> str:
        """The request's in-flight mark, looked at and never taken for more than the look,
        nor removed (the residue audit): ``"held"`` (a live process of this host runs
        it), ``"free"`` (a mark no process holds: its process died), ``"none"`` (no
        mark), or ``"host:NAME"`` (another host's mark: its lock may not reach here)."""
        if not _REQUEST_ID.fullmatch(request_id):
            return "none"
        try:
            fd = os.open(
                self._in_flight_path(request_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
            )
        except OSError:  # none, or not a mark this code wrote (bug IA)
            return "none"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "none"
            written = os.read(fd, 4096)
            if written and written != _host_line():
                host = written.decode("utf-8", "replace").removeprefix("host=").strip()
                return f"host:{host}"
            try:
                # Shared: two audits looking at once do not take each other for holders.
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return "held"
            return "free"
        finally:
            os.close(fd)  # releases the look's lock

    @contextmanager
    def erasure_owner_gone(self, request_id: str) -> Iterator[bool]:
        if not _REQUEST_ID.fullmatch(request_id):
            yield False  # no request of this code: it never had a mark
            return
        path = self._in_flight_path(request_id)
        try:
            # Never followed out of the folder, never blocked on (bug IA), nor a hard
            # link or another user's file taken for a mark (bug PP).
            fd = open_lock_file(path, create=False)
        except FileNotFoundError:
            yield False  # finished (or began before marks were kept): not known dead
            return
        except (OSError, LockFileAccessError) as error:  # not a mark this code wrote
            _log.warning("erasure in-flight mark %s: %s; left alone", path, error)
            yield False
            return
        try:
            written = os.read(fd, 4096)
            if written and written != _host_line():
                # Another host's request (a shared folder): its lock may not reach this
                # host, so an unheld lock proves nothing here. Left to a start on its
                # host, never abandoned from here (bug HY).
                yield False
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False  # its process holds it: alive
                return
            yield True
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def settled_mark(self) -> str | None:
        """The start's settled-up-to mark as last written (``write_settled_mark``)."""
        try:
            return (self.path / SETTLED_MARK_FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write_settled_mark(self, text: str) -> None:
        # Whole or not at all (a process killed mid-write leaves the old mark, or a
        # temporary file that the next write's ``os.replace`` never sees).
        path = self.path / SETTLED_MARK_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @contextmanager
    def settle_host_turn(self) -> Iterator[None]:
        """Held for a whole ``uprof erase settle-host`` run; another run waits for it."""
        fd = open_lock_file(self.path / SETTLE_HOST_LOCK_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextmanager
    def erasure_mark_of_host(
        self, request_id: str, host: str, *, keep: bool = False
    ) -> Iterator[str]:
        """An operator settling another host's requests (``uprof erase settle-host``):
        ``"none"`` when the request has no mark naming ``host``, ``"held"`` when a
        process holds it (a lock seen from here: that host is not dead), ``"gone"``
        otherwise; then the mark is held until the block ends, and removed. Refuses this
        host's own name: a start here judges its marks by their locks."""
        if f"host={host}\n".encode() == _host_line():
            raise ValueError("that is this host: its requests are judged by their locks")
        if not _REQUEST_ID.fullmatch(request_id) or "\n" in host or not host:
            yield "none"
            return
        path = self._in_flight_path(request_id)
        try:
            fd = open_lock_file(path, create=False)
        except (OSError, LockFileAccessError):  # none, or not a mark this code wrote (IA, PP)
            yield "none"
            return
        try:
            if os.read(fd, 4096) != (f"host={host}\n".encode()):
                yield "none"
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield "held"
                return
            yield "gone"
            if not keep:  # ``keep``: only looked at
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- ledger

    def append_erasure(self, record: ErasureRecord) -> None:
        line = (_record_to_json(record) + "\n").encode()
        path = self.path / LEDGER_FILE
        # Checked (bug PR): a link planted as the ledger must not receive its records.
        fd = open_key_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, secret=False)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # appends from several processes stay whole lines
            size = os.fstat(fd).st_size
            if size:
                # A process killed mid-append leaves a line without its newline: end it,
                # so the torn line stays one unreadable line (that erasure never ran).
                with open(path, "rb") as fh:
                    fh.seek(size - 1)
                    if fh.read(1) != b"\n":
                        line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def erasure_records(self) -> Sequence[ErasureRecord]:
        path = self.path / LEDGER_FILE
        with self._ledger_lock:
            try:
                # lstat: a link planted as the ledger is refused, never read (bug PR).
                found = os.lstat(path)
            except FileNotFoundError:
                self._records, self._ledger_state, self._snapshot = [], (0, 0), ()
                return ()
            if not stat.S_ISREG(found.st_mode):
                os.close(open_key_file(path, secret=False))  # raises KeyFileRefusedError, naming it
            inode, consumed = self._ledger_state
            if found.st_ino != inode or found.st_size < consumed:
                # Replaced or truncated: read it all again, into a new snapshot even when
                # it holds as many records as before (readers compare snapshots, not counts).
                self._records, consumed, self._snapshot = [], 0, None
            if found.st_size > consumed:
                with os.fdopen(open_key_file(path, secret=False), "rb") as fh:
                    fh.seek(consumed)
                    tail = fh.read()
                # Only whole lines count; a line still being written is read next time.
                whole = tail[: tail.rfind(b"\n") + 1]
                for raw in whole.splitlines():
                    try:
                        self._records.append(_record_from_json(raw.decode()))
                    except (ValueError, KeyError, UnicodeDecodeError):
                        _log.warning("erasure ledger %s: skipped an unreadable line", path)
                consumed += len(whole)
            self._ledger_state = (found.st_ino, consumed)
            snapshot = self._snapshot
            if snapshot is None or len(snapshot) != len(self._records):
                # Copied only when it changed: every key lookup asks (decision 0052).
                snapshot = self._snapshot = tuple(self._records)
            return snapshot


# ------------------------------------------------------------------ placement


def legacy_key_files(data_dir: Path) -> list[Path]:
    """Key material an older uprof left inside the data folder."""
    return [data_dir / name for name in LEGACY_FILES if (data_dir / name).exists()]


def refuse_legacy_key_files(data_dir: Path, key_dir: Path) -> None:
    """Refuse to start while key material sits inside the data folder."""
    found = legacy_key_files(data_dir)
    if found:
        names = ", ".join(p.name for p in found)
        raise KeyMaterialError(
            f"key material found inside the data folder {data_dir} ({names}); a copy of "
            f"that folder would open the data. Stop every uprof process on it, then run "
            f"`uprof keys move-out` to move it to the key folder (UPROF_KEY_DIR, now "
            f"{key_dir})."
        )


def move_key_material(data_dir: Path, key_dir: Path) -> list[str]:
    """Move legacy key files from the data folder into the key folder; return their names.

    Run with no other uprof process on the data folder. The SQLite key database is
    copied through the SQLite backup API (its WAL folded in), checked, then removed
    from the data folder; secrets are copied, synced and removed. Files already in
    the key folder are never overwritten.
    """
    make_key_folder(key_dir)  # checked as at a first start (0209-cli-truths's Left, SL)
    clash = [p.name for p in legacy_key_files(data_dir) if (key_dir / p.name).exists()]
    if clash:
        raise KeyMaterialError(
            f"both {data_dir} and {key_dir} hold {', '.join(clash)}; refusing to choose. "
            "Keep the folder the deployment last used and remove the other copy by hand."
        )
    moved: list[str] = []
    for old in legacy_key_files(data_dir):
        new = key_dir / old.name
        if old.name == KEYS_DB_FILE:
            tmp = key_dir / f".{old.name}.moving"
            tmp.unlink(missing_ok=True)
            src = sqlite3.connect(old)
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)
                dst.execute("PRAGMA journal_mode=DELETE")
                if dst.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                    raise KeyMaterialError(f"the copy of {old} failed its integrity check")
            finally:
                dst.close()
                src.close()
            os.chmod(tmp, 0o600)
            os.replace(tmp, new)
            for suffix in ("", "-wal", "-shm", "-journal"):
                old.with_name(old.name + suffix).unlink(missing_ok=True)
        else:
            shutil.copy2(old, new)
            os.chmod(new, 0o600)
            with new.open("rb") as fh:
                os.fsync(fh.fileno())
            old.unlink()
        moved.append(old.name)
    _fsync_dir(key_dir)
    _fsync_dir(data_dir)
    return moved
