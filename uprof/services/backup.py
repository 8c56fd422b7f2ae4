"""``uprof backup`` and ``uprof restore``: the data stores, consistently, never the keys.

A backup is a folder::

    manifest.json      format, backend, schema revision, audit-log head, SHA-256 per file,
                       signed with the deployment's audit key (never in the backup)
    views.sqlite       SQLite: read models + audit log (SQLite backup API, one snapshot)
    events.sqlite      SQLite: the event log (backed up *after* the views, so the views'
                       tracking position never runs ahead of the restored log)
    database.dump      PostgreSQL: ``pg_dump --format=custom`` of every table except the
                       key tables and ``alembic_version``, from one exported snapshot

It holds no key material: no master secret, no KEK, no wrapped data key, no subject
index, no audit signing key. Without the key folder it opens nothing; with it, only
what the key folder's erasure ledger still allows.

A restore replaces the data stores with the backup's and then re-applies the erasure
ledger, so an erasure made after the backup stays made. The live audit log is kept
when it extends the backup's (it is append-only: rolling it back would let the log
fork under published checkpoints); a restore into a deployment whose audit log
disagrees with the backup's is refused. While a restore runs, a marker file in the
data folder makes every other start refuse; a killed restore is finished by running
it again. Every running uprof process holds the stores open (a shared lock, the
backend's ``hold_open``); a restore takes them alone (``stores_alone``) or refuses,
changing nothing, while any process runs.

What is copied, and how, is the backend's (``Backend.backup`` and ``Backend.restore`` in
``uprof.backends.sqlite`` and ``uprof.backends.postgres``); the manifest, the checks and
the ledger's re-application are here, the same for every backend.
"""

from __future__ import annotations

import base64
import binascii
import enum
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import rfc8785
import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.errors import VerificationError
from audit.keyring import key_by_id
from audit.keys import TrustedKeys, key_id
from audit.lockfile import LockFileAccessError, open_lock_file
from audit.log import AuditLog
from audit.tables import audit_checkpoints, audit_entries, audit_nodes
from domain.errors import InvalidInputError, StoredDataDamagedError, UprofError
from domain.principal import Principal
from uprof.apikeys.tables import metadata as api_metadata
from uprof.backends import StoresInUseError, backend_for_settings
from uprof.crypto.keystore import derive_key
from uprof.crypto.tables import metadata as keys_metadata
from uprof.documents import MAX_DOCUMENT_BYTES, read_at_most
from uprof.services.sign_outs import SignOuts
from uprof.settings import Settings
from uprof.storage import (
    BACKUP_FORMAT_PREFIX,
    BACKUP_MANIFEST,
    MIGRATIONS_DIR,
    RESTORE_MARKER,
    branch_head,
    create_engine,
    downgrade_to,
    layout_for,
    migrate,
    refuse_wrong_stores,
)

_log = logging.getLogger(__name__)

FORMAT = BACKUP_FORMAT_PREFIX + "1"
#: Domain separation of a manifest's signature (``_signed_bytes``).
SIGNATURE_LABEL = b"uprof-backup-manifest/1\n"
#: Derivation label of the deployment id in a manifest (``deployment_id``).
DEPLOYMENT_LABEL = "uprof/backup-deployment/1"
MANIFEST = BACKUP_MANIFEST
#: Tables of the key store: never in a backup, never touched by a restore.
KEY_TABLES = tuple(sorted({*keys_metadata.tables, *api_metadata.tables}))
#: Audit tables and their primary keys (a restore keeps the live rows).
AUDIT_KEYS = {
    t.name: tuple(c.name for c in t.primary_key.columns)
    for t in (audit_entries, audit_nodes, audit_checkpoints)
}


class BackupError(UprofError):
    hint = "see the message; nothing was changed unless it says otherwise"


@dataclass(frozen=True)
class BackupReport:
    path: Path
    backend: str
    files: dict[str, int]
    audit_entries: int


@dataclass(frozen=True)
class RestoreReport:
    backend: str
    audit_kept_live: bool
    audit_entries: int
    ledger: Any  # recovery.LedgerReapplied
    #: Where the audit log restarted (``--restart-audit-log``), or None.
    audit_restarted_at: int | None = None


# ------------------------------------------------------------------ helpers


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _views_revision(conn: sa.Connection) -> str | None:
    """The views branch's revision recorded in a database (None: not migrated)."""
    views = _views_branch_revisions()
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
    found = [r for r in rows if r in views]
    return found[0] if found else None


def _views_branch_revisions() -> set[str]:
    """Every revision of the views branch, head to base (alembic's reading)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(config)
    return {r.revision for r in script.iterate_revisions("views@head", "base")}


def _restorable_revisions() -> list[str]:
    """The views branch's revisions a restore can take the live views down to, head
    first: down to the newest migration marked ``one_way`` (its downgrade is refused),
    which is included, the ones below it not (bug LE)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    restorable = []
    for script in ScriptDirectory.from_config(config).iterate_revisions("views@head", "base"):
        restorable.append(script.revision)
        if getattr(script.module, "one_way", False):
            break
    return restorable


def _views_head() -> str | None:
    """The views branch's newest revision: what ``migrate`` brings a store to."""
    head = branch_head("views")
    if head is None:  # the plain reading declined: alembic reads the files properly
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        head = ScriptDirectory.from_config(config).revision_map.get_current_head("views")
    return head


def _upgradable_revision(manifest: dict[str, Any], head: str | None) -> str:
    """The backup's views revision, when this release can bring it to ``head``: the head
    itself or one of the views branch's earlier revisions. Anything else is refused
    naming the backup's views file and the revision, before anything changes: a newer
    release's (restore it with that release), none or another branch's (not a store
    this release's migrations made), or one below a one-way migration (bug LE). Before
    bug KH only the head itself was accepted."""
    revision = manifest["views_revision"]
    restorable = _restorable_revisions()
    if isinstance(revision, str) and revision in restorable:
        return str(revision)
    files = ", ".join(name for name in manifest["files"] if name.startswith(("views", "database")))
    if isinstance(revision, str) and revision in _views_branch_revisions():
        # Accepted before bug LE: the live views' downgrade then failed on the one-way
        # migration after the marker was written, and every start refused.
        raise BackupError(
            f"the backup's {files or 'views'} is at schema revision {revision!r}, older "
            f"than the oldest revision this release can restore to ({restorable[-1]!r}: "
            "its migration cannot be undone); restore it with the release that made it; "
            "nothing was changed"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    known = {r.revision for r in ScriptDirectory.from_config(config).walk_revisions()}
    why = (
        "a newer release made it: restore it with that release"
        if revision is not None and revision not in known
        else "not a revision of the views branch this release upgrades from"
    )
    raise BackupError(
        f"the backup's {files or 'views'} is at schema revision {revision!r} ({why}; "
        f"this uprof brings the views branch's revisions up to {head!r}); nothing was changed"
    )


def _unknown_revisions(src: Path, manifest: dict[str, Any]) -> list[str]:
    """``file (revision)`` for each alembic revision recorded in the backup's own database
    files (listed in the manifest, checksums checked) that no migration of this release
    has. Read through the driver, read-only: a backup's copy, never a live store."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    known = {r.revision for r in ScriptDirectory.from_config(config).walk_revisions()}
    unknown = []
    for name in sorted(manifest["files"]):
        if not name.endswith(".sqlite"):
            continue
        db = sqlite3.connect(f"{(src / name).as_uri()}?mode=ro", uri=True)
        try:
            has_table = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
            ).fetchone()
            rows = db.execute("SELECT version_num FROM alembic_version") if has_table else []
            unknown += [f"{name} ({row[0]})" for row in rows if row[0] not in known]
        finally:
            db.close()
    return unknown


def _audit_head(conn: sa.Connection) -> tuple[int, str]:
    """(entry count, hex leaf hash of the last entry) of an audit log."""
    if not sa.inspect(conn).has_table(audit_entries.name):
        return 0, ""
    n = int(conn.execute(sa.select(sa.func.count()).select_from(audit_entries)).scalar_one())
    if n == 0:
        return 0, ""
    leaf = conn.execute(
        sa.select(audit_entries.c.leaf_hash).where(audit_entries.c.leaf_index == n - 1)
    ).scalar_one_or_none()
    return n, bytes(leaf).hex() if leaf is not None else ""


def _leaf_at(conn: sa.Connection, index: int) -> str:
    leaf = conn.execute(
        sa.select(audit_entries.c.leaf_hash).where(audit_entries.c.leaf_index == index)
    ).scalar_one_or_none()
    return bytes(leaf).hex() if leaf is not None else ""


def _refuse_bad_destination(settings: Settings, dest: Path) -> None:
    target = dest.expanduser().resolve()
    for name, folder in (("data_dir", settings.data_dir), ("key_dir", settings.key_path)):
        root = folder.expanduser().resolve()
        if target == root or target.is_relative_to(root):
            raise InvalidInputError(f"--to: a backup must not be inside {name} ({root})")
    if target.exists() and any(target.iterdir()):
        raise InvalidInputError(f"--to: {target} exists and is not empty")


# ------------------------------------------------------------------- backup


def backup(settings: Settings, dest: Path) -> BackupReport:
    """Write a consistent backup of the data stores (no keys) into the new folder ``dest``."""
    _refuse_bad_destination(settings, dest)
    dest = dest.expanduser().resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial-{secrets.token_hex(4)}")
    with _stores_held_open(settings), _writing(partial):
        # What killed backups left here (bug KI): a copy of the stores outside the
        # backup set. Removed only once this process holds its own partial's lock.
        remove_stale_partials(dest.parent)
        partial.mkdir(mode=0o700)
        return _write_backup(settings, partial, dest)


#: A backup's folder while it is written: ``.<name>.partial-<8 hex>``.
_PARTIAL = re.compile(r"^\..+\.partial-[0-9a-f]{8}$")
#: Beside a partial folder: the file whose flock its writer holds while it lives.
_WRITER_LOCK = ".lock"


@contextmanager
def _writing(partial: Path) -> Iterator[None]:
    """Hold the partial folder's writer lock (an exclusive flock of the file beside it)
    from before the folder exists until it is renamed or removed. The system drops a
    flock when its holder dies, kill -9 included: a partial whose lock anyone can take
    has no writer left (``partials``). Never a lock inside the folder: it would be
    renamed into the backup."""
    lock = partial.with_name(partial.name + _WRITER_LOCK)
    fd = open_lock_file(lock, new=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not _locks_the_file_at(fd, lock):
            # Between the create and the flock, another backup took the then unheld
            # lock for a stale one's and removed the file: locked, this descriptor
            # guards nothing another process can see.
            raise BackupError(
                "another uprof backup in the same folder removed this one's lock file as "
                "it began; run the backup again; nothing was written"
            )
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


@dataclass(frozen=True)
class Partial:
    path: Path
    #: True: a live process is writing it (its lock is held); False: left by a killed one.
    being_written: bool


@contextmanager
def _taken(partial: Path, *, create: bool = True) -> Iterator[bool]:
    """Try to take a partial folder's writer lock without waiting: True (held until the
    block ends) when no process holds it, that is when its writer is gone. A partial
    without its lock file has no writer either (a writer creates the file before the
    folder and removes it after the rename): an earlier release's, or a lost file;
    ``create=False`` (a look that must write nothing) says so without creating one."""
    lock = partial.with_name(partial.name + _WRITER_LOCK)
    try:
        # Checked (bug PP): a symlink planted under a lock file's name must not make
        # this create (or open for writing) the file it points to, anywhere (bug LC);
        # a folder or another user's unreadable file under it failed every backup into
        # this folder with a traceback.
        fd = open_lock_file(lock, create=create)
    except FileNotFoundError:
        yield True
        return
    except LockFileAccessError as error:
        if os.path.islink(lock):
            # A link, not a writer's lock: a writer creates its own with O_EXCL, which
            # a name already taken by a link refuses, so no writer holds this partial.
            yield True
            return
        # Not a lock this release's writers make (a folder, a FIFO, a hard link, a
        # file of another user's or others may write): whose partial it guards is not
        # known, so it is left alone, never removed (the backup goes on beside it).
        _log.warning("backup writer lock %s: %s; its partial folder is left alone", lock, error)
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        # Taken, but the file at the path may be another by now (removed by another
        # remover, or created again): only the lock of the file still there decides.
        yield _locks_the_file_at(fd, lock)
    finally:
        os.close(fd)


def _locks_the_file_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is open on the file that ``path`` names now."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def partials(parent: Path) -> list[Partial]:
    """The partial backup folders in ``parent``, each with whether a process writes it
    (for ``uprof audit residue --backups``). A lock file left without its folder (its
    writer killed between the rename and the unlink) is not a copy of anything."""
    if not parent.is_dir():
        # Nothing looked at is no finding: a mistyped or unmounted folder must not read
        # as "residue: 0" (bug LD).
        raise InvalidInputError(f"--backups: {parent} is not a folder")
    found = []
    for path in sorted(parent.iterdir()):
        if _is_partial_folder(path):
            with _taken(path, create=False) as gone:
                found.append(Partial(path, being_written=not gone))
    return found


def _is_partial_folder(path: Path) -> bool:
    """Whether ``path`` is a folder a backup wrote (``backup``'s ``partial``): named so,
    and a real folder. A symlink named so is not one (a backup never makes one): it is
    neither a copy of the stores nor the cleaner's to remove, and ``shutil.rmtree``
    refuses it, which made every backup into its parent fail (bug LC)."""
    return bool(_PARTIAL.match(path.name)) and path.is_dir() and not path.is_symlink()


def remove_stale_partials(parent: Path) -> list[Path]:
    """Remove each partial backup folder in ``parent`` that no process is writing, and
    its lock file; the folder is removed while this process holds its lock, so a second
    remover skips it. Returns what was removed."""
    removed = []
    names = {p.name.removesuffix(_WRITER_LOCK) for p in parent.iterdir()}
    for name in sorted(n for n in names if _PARTIAL.match(n)):
        partial = parent / name
        with _taken(partial) as gone:
            if not gone:
                continue  # a live backup's
            if _is_partial_folder(partial):
                shutil.rmtree(partial)
                removed.append(partial)
            partial.with_name(name + _WRITER_LOCK).unlink(missing_ok=True)
    if removed:
        _fsync(parent)
    return removed


@contextmanager
def _stores_held_open(settings: Settings) -> Iterator[None]:
    """Hold the stores open while the backup reads them, as a running process does: a
    restore refuses meanwhile instead of replacing the files under the backup, and a
    backup of stores an interrupted restore left half-replaced is refused (the
    manifest's checksums would vouch for them)."""
    from uprof.bootstrap import RestoreInterruptedError, refuse_interrupted_restore

    layout = layout_for(settings)
    views = create_engine(layout.views_url)
    try:
        try:
            release = backend_for_settings(settings).hold_open(views)
        except StoresInUseError as error:
            raise RestoreInterruptedError(f"{error}; nothing was written") from None
        try:
            refuse_interrupted_restore(settings)
            yield
        finally:
            release()
    finally:
        views.dispose()


def log_anchors_now(settings: Settings) -> dict[str, Any]:
    """Every anchor of the live event log, read now from the key store: for a backend
    that checks its copy of the log after copying it (SQLite), read *before* the copy
    begins, so every version an anchor names is in the copy (an anchor is written after
    its event commits)."""
    from uprof.eventstore import log_anchors, log_identity

    layout = layout_for(settings)
    events = sa.create_engine(layout.events_url)  # only its URL: never connected
    keys = create_engine(layout.keys_url)  # its busy timeout: a read waits out a commit
    try:
        log_id = log_identity(backend_for_settings(settings), events)
        with keys.connect() as conn:
            return log_anchors(conn, log_id)
    finally:
        keys.dispose()
        events.dispose()


def refuse_damaged_copy(conn: sa.Connection, anchors: dict[str, Any]) -> None:
    """Refuse to vouch for a copy of the event log that a load refuses: a stream below
    its anchor or whose anchored row was replaced (bug IT). Signed and later restored,
    such a copy became the truth (``reanchor``), and a consent withdrawal cut from it
    was gone for good. ``conn`` reads the copy itself (the copied file, or the dump's
    snapshot), never the live store after the copy: a cut put back between the copy and
    a check of the live store was not seen (review of 0150, bug JM)."""
    from uprof.eventstore import damaged_in

    damaged = damaged_in(conn, anchors)
    if damaged:
        raise StoredDataDamagedError(
            f"backup refused: {len(damaged)} subject stream(s) end before the last version "
            "known committed, or their head row is not the one committed there (damaged or "
            "altered storage: restore an earlier backup, or erase those subjects); nothing "
            "was written"
        )


def _write_backup(settings: Settings, partial: Path, dest: Path) -> BackupReport:
    try:
        # The backend checks its copy of the log against the anchors (refuse_damaged_copy).
        manifest = backend_for_settings(settings).backup(settings, partial)
        manifest["files"] = {
            p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size}
            for p in sorted(partial.iterdir())
        }
        _sign(settings, manifest)
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        for p in partial.iterdir():
            _fsync(p)
        _fsync(partial)
        if dest.exists():
            dest.rmdir()  # empty, checked above
        os.rename(partial, dest)  # the backup appears complete or not at all
        _fsync(dest.parent)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return BackupReport(
        dest,
        manifest["backend"],
        {k: v["bytes"] for k, v in manifest["files"].items()},
        manifest["audit"]["entries"],
    )


def deployment_id(settings: Settings) -> str | None:
    """Names the deployment a backup belongs to: a key derived from its master secret
    for this one use (it tells nothing of the secret or of any other key), hashed. None
    while the key folder holds no master key."""
    from uprof.bootstrap import build_key_material

    try:
        material = build_key_material(settings)
    except (UprofError, ValueError):
        return None  # key files misplaced: the start refuses and names them, not a backup
    if not material.has_master_secret():
        return None
    return hashlib.sha256(derive_key(material.master_secret(), DEPLOYMENT_LABEL)).hexdigest()


def _signed_bytes(manifest: dict[str, Any]) -> bytes:
    """What a manifest's signature covers: a label of its own (a signature made for an
    audit checkpoint or a receipt never verifies here), then the manifest without its
    signature as canonical JSON (RFC 8785): every file's checksum included."""
    body = {name: value for name, value in manifest.items() if name != "signature"}
    return SIGNATURE_LABEL + rfc8785.dumps(body)


def _sign(settings: Settings, manifest: dict[str, Any]) -> None:
    """Sign the manifest with the deployment's audit signing key (in the key folder, never
    in the backup): whoever can write the backup folder cannot edit a file and its
    checksum unseen. Unsigned while the key folder holds no master key (such a backup
    restores nowhere: a restore needs the master key)."""
    from uprof.bootstrap import build_key_material

    material = build_key_material(settings)
    if not material.has_master_secret():
        return
    key = material.audit_signing_key()
    manifest["signature"] = {
        "algorithm": "ed25519",
        "key_id": key_id(key),
        "value": base64.b64encode(key.sign(_signed_bytes(manifest))).decode("ascii"),
    }


@dataclass(frozen=True)
class OperatorVouched:
    """Why a restored manifest rests on the operator's word (``--allow-unsigned``), not on
    a signature of this deployment: ``rule`` ``manifest-unsigned``, or
    ``manifest-retired-key`` with that key's id. Recorded in ``backup.restored`` (bug MJ,
    review of decision 0175-retired-below), so the trail tells these restores apart."""

    rule: str
    audit_key_id: str | None = None

    #: Further rules the operator vouched for (``RESTART_RULE``).
    also: tuple[str, ...] = ()

    def entry_fields(self) -> dict[str, str | list[str]]:
        rules = [r for r in (self.rule, *self.also) if r]
        fields: dict[str, str | list[str]] = {
            "decision": "operator-vouched",
            "rule": rules[0] if len(rules) == 1 else rules,
        }
        if self.audit_key_id is not None:
            fields["audit_key_id"] = self.audit_key_id
        return fields

    @staticmethod
    def adding(vouched: OperatorVouched | None, rule: str) -> OperatorVouched:
        """``vouched`` with ``rule`` too (a restore both unsigned and restarting says both)."""
        if vouched is None:
            return OperatorVouched("", also=(rule,))
        return OperatorVouched(vouched.rule, vouched.audit_key_id, (*vouched.also, rule))


def _check_signature(
    manifest: dict[str, Any], keys: Sequence[Ed25519PublicKey], unsigned_ok: bool
) -> OperatorVouched | None:
    """Refuse a manifest that no key of this deployment's audit key history (the current
    key and those it rotated from, ``audit.keyring``) signed, naming why. Return what the
    operator vouched for with ``unsigned_ok`` instead of a signature (None: a key did)."""
    signature = manifest.get("signature")
    if signature is None:
        if unsigned_ok:
            return OperatorVouched("manifest-unsigned")
        raise BackupError(
            f"{MANIFEST} is not signed (a backup written before 2026-12-04, or one whose "
            "signature was removed): nothing vouches that its files are the ones written; "
            "check where it came from, then restore it with --allow-unsigned; nothing was "
            "changed"
        )
    if (
        not isinstance(signature, dict)
        or signature.get("algorithm") != "ed25519"
        or not isinstance(signature.get("key_id"), str)
        or not isinstance(signature.get("value"), str)
    ):
        raise InvalidInputError(
            f"--from: {MANIFEST} has no valid signature (algorithm, key_id, value)"
        )
    key = key_by_id(keys, signature["key_id"])
    if key is None:
        raise BackupError(
            f"{MANIFEST} is signed by another key than this deployment's audit signing keys "
            "(the current one and those its key history endorses: another deployment, or an "
            "edited backup): restore a backup beside the key folder of the deployment that "
            "wrote it; nothing was changed"
        )
    try:
        raw = base64.b64decode(signature["value"], validate=True)
        key.verify(raw, _signed_bytes(manifest))
    except (InvalidSignature, binascii.Error, ValueError):
        raise BackupError(
            f"{MANIFEST} does not match its signature: the backup was edited after it was "
            "written; nothing was changed"
        ) from None
    if isinstance(keys, TrustedKeys):
        # Bug KO (decision 0165-review-of-0160): a key rotated out at tree size N vouches
        # for no backup of a longer log, as for no checkpoint of one (a leaked old key).
        try:
            keys.check_signed_range(key, int(manifest["audit"]["entries"]), None)
        except VerificationError as exc:
            raise BackupError(
                f"{MANIFEST} of a log of {manifest['audit']['entries']} entries is signed "
                f"by an audit key that was rotated out before that ({exc.reason}); nothing "
                "was changed"
            ) from None
        # Bug LM (decision 0175-retired-below): at or below the point, a retired key's
        # signature binds nothing a leaked copy of it could not sign; the backup is as
        # good as unsigned, and restored, like one, by an operator who checked it.
        try:
            keys.check_vouches_alone(key, MANIFEST)
        except VerificationError as exc:
            if not unsigned_ok:
                highest = _highest_point(keys) if isinstance(keys, TrustedKeys) else None
                also = (
                    f" (into an empty data folder also --restart-audit-log: its audit log "
                    f"of {manifest['audit']['entries']} entries ends below the rotation "
                    f"point at tree size {highest.tree_size})"
                    if highest is not None and manifest["audit"]["entries"] < highest.tree_size
                    else ""
                )
                raise BackupError(
                    f"{exc.reason} (a backup taken before an audit key rotation, or one "
                    "whose manifest a leaked old key signed): nothing vouches that its files "
                    "are the ones written; check where it came from, then restore it with "
                    f"--allow-unsigned{also}; nothing was changed"
                ) from None
            return OperatorVouched("manifest-retired-key", key_id(key))
    return None


def _manifest(
    settings: Settings, backend: str, revision: str | None, audit: tuple[int, str]
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "backend": backend,
        "created_at": datetime.now(UTC).isoformat(),
        "tenant": settings.tenant,
        "deployment": deployment_id(settings),
        "views_revision": revision,
        "audit": {"entries": audit[0], "last_leaf_hash": audit[1]},
        "key_material": "none: keys stay in the key folder (UPROF_KEY_DIR)",
    }


# ------------------------------------------------------------------ restore


def read_manifest(settings: Settings, src: Path) -> dict[str, Any]:
    """Read and check a backup's manifest and files; raise naming what is wrong."""
    path = src / MANIFEST
    if not path.is_file():
        raise InvalidInputError(f"--from: {src} holds no {MANIFEST}; not a uprof backup")
    # Within the bound of every file uprof takes whole: a sparse manifest of terabytes was
    # read whole, a MemoryError for the operator who mistyped --from (bug OG).
    content = read_at_most(path)
    if content is None:
        raise InvalidInputError(
            f"--from: {MANIFEST} is longer than {MAX_DOCUMENT_BYTES} bytes, the most uprof "
            "reads of one; not a uprof backup"
        )
    try:
        manifest = json.loads(content.decode("utf-8"))
    except ValueError as error:
        raise InvalidInputError(f"--from: {MANIFEST} is not JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise InvalidInputError(f"--from: {MANIFEST} is not a JSON object; not a uprof backup")
    if manifest.get("format") != FORMAT:
        raise InvalidInputError(f"--from: unknown backup format {manifest.get('format')!r}")
    backend = backend_for_settings(settings)
    if manifest.get("backend") != backend.name:
        raise InvalidInputError(
            f"--from: a {manifest.get('backend')} backup cannot be restored into {backend.name}"
        )
    _check_manifest_fields(manifest)
    files: dict[str, Any] = manifest["files"]
    # Every file the restore reads must be listed, and checked: a file left out of the
    # manifest would be restored unchecked.
    unlisted = [name for name in backend.backup_files if name not in files]
    if unlisted:
        raise InvalidInputError(
            f"--from: {MANIFEST} does not list {', '.join(unlisted)}; not a complete backup"
        )
    for name, meta in files.items():
        file = src / name
        if (
            Path(name).name != name
            or not isinstance(meta, dict)
            or not file.is_file()
            or _sha256(file) != meta.get("sha256")
        ):
            raise InvalidInputError(f"--from: {name} is missing or does not match its checksum")
    return manifest


def _check_manifest_fields(manifest: dict[str, Any]) -> None:
    """Refuse, naming the field, a manifest whose fields the restore reads are missing or
    of the wrong type (before anything changes)."""
    audit = manifest.get("audit")
    problems = [
        name
        for name, ok in (
            ("files", isinstance(manifest.get("files"), dict)),
            # Present, even when None (a store never migrated): read as ``[...]`` below; a
            # manifest without it ended the restore in a KeyError (bug JJ).
            (
                "views_revision",
                "views_revision" in manifest and isinstance(manifest["views_revision"], str | None),
            ),
            ("deployment", isinstance(manifest.get("deployment"), str | None)),
            ("audit", isinstance(audit, dict)),
            ("audit.entries", isinstance(audit, dict) and type(audit.get("entries")) is int),
            (
                "audit.last_leaf_hash",
                isinstance(audit, dict) and isinstance(audit.get("last_leaf_hash"), str),
            ),
        )
        if not ok
    ]
    if problems:
        raise InvalidInputError(
            f"--from: {MANIFEST} has no valid {', '.join(problems)}; not a uprof backup "
            "(or an edited one)"
        )


def restore(
    settings: Settings,
    src: Path,
    *,
    allow_unsigned: bool = False,
    restart_audit_log: bool = False,
) -> RestoreReport:
    """Replace the data stores with a backup's, then re-apply the erasure ledger.

    The manifest must carry this deployment's signature (``allow_unsigned``: a backup
    written before manifests were signed, restored after checking where it came from).
    A restore whose audit log would end below a rotation point of the key history is
    refused (bug MO) unless ``restart_audit_log``: the log then restarts there, recorded
    in the key history by the current key (``_audit_restart``)."""
    from uprof.bootstrap import build_key_material

    # The start's looks, before anything is read or copied: the start inside the restore
    # asked them only after the backup's stores were copied over the data folder's, so
    # another backup's folder (XX) and another program's events.sqlite (YB) were
    # written over, and a folder that cannot be written was told as the outage (XZ).
    refuse_wrong_stores(settings)
    src = src.expanduser().resolve()
    manifest = read_manifest(settings, src)
    material = build_key_material(settings)  # refuses misplaced key files before any change
    if not material.has_master_secret():
        # Without the deployment's key folder a backup opens nothing (its keys never were
        # in it), and the start after the copy would refuse, leaving the marker behind.
        raise BackupError(
            f"the key folder {material.location} holds no master key: a backup is restored "
            "beside the key folder of the deployment that wrote it (UPROF_KEY_DIR, "
            "--key-dir); nothing was changed"
        )
    written_by = manifest.get("deployment")
    if written_by is not None and written_by != deployment_id(settings):
        # Its events and view fields are under keys this key folder never held: restored,
        # every subject would read as unknown while new captures went on beside them.
        raise BackupError(
            f"this backup was written by another deployment (another master key than the "
            f"one in {material.location}): restore it beside its own key folder; nothing "
            "was changed"
        )
    # After the deployment check, whose refusal names the usual mistake; an edited
    # manifest (a deployment field removed included) stops here, before the stores are
    # taken (a key history only grows: a signature it vouches for now, it vouches for
    # under the lock too).
    vouched = _check_signature(manifest, _trusted_keys(material), allow_unsigned)
    layout = layout_for(settings)  # creates the data and key folders if needed
    views = create_engine(layout.views_url)
    try:
        # Alone on the stores from the first look to the marker's removal: a process
        # still running would keep writing into the copy, or fail on what it cached.
        with backend_for_settings(settings).stores_alone(views):
            # The key history the restart is decided by is read alone on the stores: read
            # before, it was another restore's of before its restart, and this one took
            # the log for short, copied the backup over that restore's stores and then
            # failed in the key ring, the marker left (bug PF).
            audit = _AuditChoice(_trusted_keys(material), restart_audit_log)
            return _restore_alone(settings, src, manifest, views, vouched, audit)
    finally:
        views.dispose()


def _trusted_keys(material: Any) -> TrustedKeys:
    """The key folder's audit key history, as ranges (read from its file each time)."""
    ranges = material.audit_keys().trusted()
    return ranges if isinstance(ranges, TrustedKeys) else TrustedKeys(ranges)


def _restore_alone(
    settings: Settings,
    src: Path,
    manifest: dict[str, Any],
    views: sa.Engine,
    vouched: OperatorVouched | None,
    audit: _AuditChoice,
) -> RestoreReport:
    from uprof.bootstrap import bootstrap

    # Compared before the live views are migrated: a refused restore changes nothing. It
    # migrated them first, so its refusal left them at this release's head (and the key
    # store not), where the previous release it sends the operator to could neither
    # start nor restore (bug JB).
    head = _views_head()
    backup_revision = _upgradable_revision(manifest, head)
    # The views' revision is not the only one a backup carries: a SQLite backup's event
    # log holds the events branch's. One this release does not know (a newer release's)
    # was copied in, and the start inside the restore then failed on it, the stores
    # replaced and the marker left (bug JI). An older one is upgraded by that start.
    unknown = _unknown_revisions(src, manifest)
    if unknown:
        raise BackupError(
            f"the backup's {', '.join(unknown)} is at a schema revision this uprof does not "
            "know: a newer release made it; restore it with that release; nothing was changed"
        )
    # Before the live views are migrated, so that a refusal changes nothing (the audit
    # table's columns read here are those of its first migration).
    marker = settings.data_dir / RESTORE_MARKER
    earlier = _killed_run(marker)
    keep_live_audit = _live_audit_extends(views, manifest)
    # A killed run that took the backup's log (the live one was empty) left that log in
    # place, and this run keeps it (with what the killed run logged): it is the backup's
    # log still, and the key folder's anchor must be forgotten as the first run would
    # have (bug NP: the anchor refused the rolled-back log, and the restore never ended).
    took_backup_log = not keep_live_audit or earlier.get(MARKER_AUDIT_LOG) == LOG_FROM_BACKUP
    restart = _audit_restart(
        views,
        manifest,
        keep_live_audit,
        audit,
        restarted_before=earlier.get(MARKER_RESTART) is True,
    )
    migrate(views, "views")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Sign-outs are kept like the live audit log: the backup's views were copied before
    # the sessions signed out since, whose cookies would otherwise open again. They go in
    # the marker too (random session ids, no credential): a killed restore, run again,
    # finds the views already replaced and the live ones only there. So do this run's
    # choices about the audit log, which a run again cannot read from the stores.
    signed_out = _sign_outs_to_keep(earlier, views)
    marker.write_text(
        json.dumps(
            {
                "from": str(src),
                "started_at": datetime.now(UTC).isoformat(),
                "sign_outs": [[sid, until.isoformat()] for sid, until in signed_out],
                MARKER_AUDIT_LOG: LOG_FROM_BACKUP if took_backup_log else LIVE_LOG_KEPT,
                MARKER_RESTART: restart is not None,
            }
        )
        + "\n",
        encoding="utf-8",
    )
    _fsync(marker)
    _fsync(settings.data_dir)
    keep_live_policy = backend_for_settings(settings).holds_a_policy(settings)
    if backup_revision != head:
        # A backup of an older release (bug KH): the live views go down to its revision
        # first, so what the copy keeps of them (the audit rows, the tables it does not
        # replace on PostgreSQL) and what it brings have one schema, and alembic's
        # record says so; the start below upgrades all of it to head. Under the marker:
        # killed anywhere from here, every start refuses and the restore run again
        # upgrades the live views, takes them down and copies again.
        downgrade_to(views, "views", backup_revision)
    backend_for_settings(settings).restore(settings, src, keep_live_audit)
    kernel = bootstrap(settings, restoring=True)  # upgrades every branch to head
    try:
        from uprof.services.recovery import reapply_ledger, withdraw_again

        if keep_live_policy and kernel.policy_service is not None:
            # The live policy is kept, and anchored again below: checked first against
            # the anchors it has, or a damaged one (a revocation cut from its tail, an
            # older store put back) would become the policy in force (bug HS).
            _check_live_policy(kernel.policy_service, kernel.app.events_engine, settings)

        if took_backup_log or restart is _Restart.NOW:
            # Before the anchors are forgotten and before a restart is signed into the
            # key history (bug OD): the backup's log must be one this deployment's keys
            # signed. Another deployment's, its manifest stripped and restored with
            # --allow-unsigned, was restarted on the record (for good) before its
            # checkpoints were found signed by keys this deployment never had.
            _check_backup_log(kernel.audit_log, restart=restart is _Restart.NOW)
        # The key store's stream anchors name the live log's heads, which this older log
        # lacks: the operator chose it, so its heads are the anchors from now on (before
        # anything loads a stream; decision 0132-stream-head-anchor).
        kernel.app.reanchor()
        if took_backup_log or restart is _Restart.NOW:
            # Likewise the audit log's: the backup's log (the live one was empty) is the
            # one the operator chose, shorter than the checkpoint the key folder keeps.
            kernel.audit_log.reanchor()
        if restart is _Restart.NOW:
            # Before anything else is logged: the log restarts where the backup's ends,
            # the current key vouching for it in the key history (bug MP).
            kernel.rotate_audit_key(
                requested_by=Principal.local_operator(kernel.subjects.tenant).label,
                restart=True,
            )
        restarted_at: int | None = None
        if restart is not None:
            vouched = OperatorVouched.adding(vouched, RESTART_RULE)
            restarted_at = _highest_point(kernel.audit_log.trusted_keys()).tree_size
        # That replaced every anchor, the policy store's too: anchor the policy in place
        # (the live one kept, or the backup's; decision 0140-sealed-policy-store).
        if kernel.policy_service is not None:
            kernel.policy_service.anchor_policy()
        ledger = reapply_ledger(kernel)
        # The ledger holds erasures, not withdrawals: a consent withdrawn after the backup
        # is in force in the backup's log, and only the live audit log (kept) records its
        # withdrawal. Written again into the stream, or the app was served the subject's
        # data again under a consent the subject had withdrawn (bug LB).
        withdrawn_again = withdraw_again(kernel)
        if kernel.web_sign_outs is not None:
            kernel.web_sign_outs.keep(signed_out, now=datetime.now(UTC))
        # Only the operator of the stores can restore (the stores are held alone, so no
        # authorized door is open): the entry names the command line's principal.
        kernel.audit.record(
            "backup.restored",
            principal=Principal.local_operator(kernel.subjects.tenant).label,
            tree_size=int(manifest["audit"]["entries"]),
            reason_code="log-from-backup" if took_backup_log else "live-log-kept",
            counts={
                "erased_streams": ledger.erased_streams,
                "erased_captures": ledger.erased_captures,
                "resurrected": ledger.resurrected,
                "withdrawals_reapplied": withdrawn_again,
            },
            **({} if vouched is None else vouched.entry_fields()),
        )
        with kernel.views_engine.connect() as conn:
            entries, _ = _audit_head(conn)
        kernel.audit_log.verify_integrity()
    finally:
        kernel.close()
    marker.unlink()
    _fsync(settings.data_dir)
    return RestoreReport(manifest["backend"], not took_backup_log, entries, ledger, restarted_at)


def _check_backup_log(log: AuditLog, *, restart: bool) -> None:
    """Refuse (``BackupError``, naming what to do) a backup's audit log, copied in place
    of an empty one, that this deployment's key history does not vouch for: a stored
    hash that its entries do not give, a checkpoint signed by a key the history does
    not hold (another deployment's log), a root at a rotation point that is not the
    recorded one. Not compared with the key folder's anchor, which the restore is about
    to forget (the operator chose an older log). The restore marker stays: every start
    refuses until a restore finishes."""
    try:
        log.verify_integrity(against_anchor=False)
    except VerificationError as error:
        raise BackupError(
            f"the backup's audit log does not verify with this deployment's audit keys "
            f"({error.reason}): another deployment's backup, an edited one, or one of a "
            "timeline an audit log restart abandoned"
            + (": the audit log was not restarted" if restart else "")
            + "; the data stores now hold its copy, and every start refuses. Empty the data "
            "stores (SQLite: move the data folder away; PostgreSQL: drop the data tables, "
            "keep the key tables), then restore a backup of this deployment"
        ) from None


def _check_live_policy(policy: Any, events: sa.Engine, settings: Settings) -> None:
    """Refuse to keep a damaged live policy (``PolicyStoreDamagedError``), naming the
    way to take the backup's instead; the restore marker stays, so every start refuses
    until ``uprof restore`` is run again. Its tables first: kept as they are, a table not
    of the shape uprof made (a column more on SQLite, a column renamed, of another type)
    refused every start after the restore as before it, the remedy its hint names
    (0228-review-of-0224-and-store-shapes, bug VC)."""
    from uprof.bootstrap import policy_store_engine
    from uprof.services.policy_seal import PolicyStoreDamagedError
    from uprof.storage import policy_store_env

    try:
        with policy_store_engine(events, policy_store_env(settings)) as engine:
            policy.app.require_shape(engine)
        policy.app.check_every_stream()
    except PolicyStoreDamagedError as error:
        raise BackupError(
            f"the live policy store is damaged ({error}); a restore keeps the live policy "
            "and would make it the policy in force. Move policies.sqlite out of the data "
            "folder (PostgreSQL: delete the rows of the policies_events and "
            "policies_snapshots tables, or drop both tables when one is not of the shape "
            "uprof made), then run uprof restore again: it takes the backup's policy"
        ) from None


#: What a restore's marker says of its audit log (``_killed_run``): which log it took,
#: and whether it restarts the log (``--restart-audit-log``).
MARKER_AUDIT_LOG = "audit_log"
LOG_FROM_BACKUP = "from-backup"
LIVE_LOG_KEPT = "live-kept"
MARKER_RESTART = "restarts_audit_log"


def _killed_run(marker: Path) -> dict[str, Any]:
    """What a killed restore wrote in its marker ({} when none is there, or it is not a
    JSON object: a marker of an earlier release says less, and is read as saying
    nothing of what it does not say)."""
    try:
        earlier = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return earlier if isinstance(earlier, dict) else {}


def _sign_outs_to_keep(earlier: dict[str, Any], views: sa.Engine) -> list[tuple[str, datetime]]:
    """The live stores' sign-outs in force, with those a killed restore's marker
    (``earlier``, ``_killed_run``) kept."""
    now = datetime.now(UTC)
    kept = dict(SignOuts(views).in_force(now))
    rows = earlier.get("sign_outs", [])
    for row in rows if isinstance(rows, list) else []:
        try:
            sid, until = str(row[0]), datetime.fromisoformat(str(row[1]))
        except (TypeError, ValueError, IndexError):
            continue
        if until.tzinfo is None:
            until = until.replace(tzinfo=UTC)
        if until >= now:
            kept.setdefault(sid, until)
    return sorted(kept.items())


#: ``backup.restored``'s ``rule`` for a restore that restarted the audit log.
RESTART_RULE = "audit-log-restarted"


class _Restart(enum.Enum):
    """What a restore does about a log restart (``_audit_restart``)."""

    #: Restart the log now (``--restart-audit-log``, the log short of a point).
    NOW = "now"
    #: Done already: a restore run again after it was killed past its restart record.
    DONE = "done"


def _highest_point(trusted: TrustedKeys) -> Any:
    """The highest rotation point the key history records (a ``RetiredAt``), or None."""
    return max(trusted.retired_at.values(), key=lambda p: p.tree_size, default=None)


@dataclass(frozen=True)
class _AuditChoice:
    """The key history's ranges, and whether the operator asked for a log restart."""

    trusted: TrustedKeys
    restart: bool


def _audit_restart(
    views: sa.Engine,
    manifest: dict[str, Any],
    keep_live: bool,
    audit: _AuditChoice,
    *,
    restarted_before: bool,
) -> _Restart | None:
    """Whether the restore restarts the audit log; refuse it, changing nothing, when the
    log it leaves (the live one kept, or the backup's) ends below the highest rotation
    point of the key history without ``--restart-audit-log`` (bug MO), and the flag when
    there is nothing to restart. Such a log grows past the point N with another root than
    the retired key signed there, and every whole-trail export fails from then on.
    ``restarted_before``: a killed restore's marker says it restarts the log; if it did
    before it died, the history's highest point is that restart's and the restore run
    again finishes it (``DONE``), with the flag or without (bug OC). Only then: a
    history whose highest point is an older restart's, at the same size, is also that of
    a deployment restarted long ago and lost again (bug NO)."""
    highest = _highest_point(audit.trusted)
    if keep_live:
        with views.connect() as conn:
            size, _ = _audit_head(conn)
        whose = "the live audit log (kept: it extends the backup's)"
    else:
        size = int(manifest["audit"]["entries"])
        whose = "the backup's audit log"
    short = highest is not None and size < highest.tree_size
    if not short and restarted_before and highest is not None and highest.abandoned is not None:
        # The killed run restarted the log (its marker says it would, and the history's
        # highest point is a restart the log reaches): done, whether or not the flag is
        # given again. Run again without it, the restore took it for no restart, wrote
        # "restarts_audit_log": false into the marker, and its trail entry did not say
        # the operator had restarted the log (bug OC).
        return _Restart.DONE
    if short and not audit.restart and highest is not None:
        raise BackupError(
            f"{whose} holds {size} entries, but the audit key history says a key was "
            f"rotated out at tree size {highest.tree_size} (a backup taken before that "
            "rotation): restored, the log would grow past that point with another root than "
            "the one that key signed, and no whole audit trail would verify from then on. "
            "Restore a backup taken after the rotation; or, if none is left, run "
            "`uprof restore --restart-audit-log`: the current audit key then signs, in the "
            f"key history, that the log restarts at {size} entries, abandoning what was "
            f"logged after them up to {highest.tree_size} (receipts and checkpoints of that "
            "range are refused from then on); nothing was changed"
        )
    if audit.restart and not short:
        raise BackupError(
            f"--restart-audit-log: nothing to restart: {whose} holds {size} entries and "
            "reaches every rotation point the audit key history records; restore without "
            "it; nothing was changed"
        )
    return _Restart.NOW if short else None


def _live_audit_extends(views: sa.Engine, manifest: dict[str, Any]) -> bool:
    """True: keep the live audit log. False: take the backup's (the live one is empty)."""
    n_backup = int(manifest["audit"]["entries"])
    with views.connect() as conn:
        n_live, _ = _audit_head(conn)
        if n_live == 0:
            return False
        if n_live >= n_backup and (
            n_backup == 0 or _leaf_at(conn, n_backup - 1) == manifest["audit"]["last_leaf_hash"]
        ):
            return True
    raise BackupError(
        "the live audit log does not extend the backup's (another deployment, or a rewritten "
        "log); restoring would fork it. Restore into a deployment with an empty data folder."
    )
