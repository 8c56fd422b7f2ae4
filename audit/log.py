"""The append-only, tamper-evident audit log (RFC 9162 Merkle tree over SQL rows).

Writes. ``append``/``append_many`` validate every entry against the allowlist
(``audit.entry``) and canonicalise it (RFC 8785) before touching the database, so a refused
batch writes nothing. Inside one transaction they take the log's write lock, read the current
size and the frontier (at most log2(n) perfect nodes), insert the new leaves at the next dense
indexes and every perfect node those leaves complete. Nothing is ever rehashed.

Write lock: the backend's ``serialised_transaction`` (``audit.tables.AuditBackend``).
PostgreSQL: ``pg_advisory_xact_lock`` under READ COMMITTED, so the size read after the lock is
current. SQLite: ``BEGIN IMMEDIATE`` takes the database write lock up front (other writers wait
on the busy timeout). On any backend a unique-key clash or a busy database rolls
the whole batch back and retries it, so indexes stay dense 0..n-1 without gaps.

There is no UPDATE or DELETE path anywhere in this package, and the tables carry triggers
that refuse them (``audit.tables.AuditBackend.append_only_ddl``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha256
from typing import Any, Protocol, TypeVar, runtime_checkable

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit.canonical import canonical_bytes
from audit.checkpoint import check_origin, sign_checkpoint, verify_checkpoint
from audit.entry import format_timestamp, normalise_timestamp, validate_entry
from audit.errors import AuditKeyError, VerificationError
from audit.export_format import EXPORT_SIGNATURE_CONTEXT
from audit.keyring import SigningKeys, StaticSigningKeys
from audit.keys import HELD_BY_READER, RetiredAt, TrustedKeys, key_id
from audit.merkle import (
    EMPTY_ROOT,
    Frontier,
    NodeGetter,
    consistency_path,
    frontier_keys,
    inclusion_path,
    leaf_hash,
    tree_hash,
)
from audit.tables import AuditBackend, audit_checkpoints, audit_entries, audit_nodes
from domain.errors import (
    InvalidInputError,
    StoreBusyError,
    VersionConflictError,
)
from domain.under_lock import CHECK_UNDER_LOCK_WITHIN_S, asked_within

#: Any constant works; it only has to be the same in every process that writes this log.
_APPEND_LOCK = int.from_bytes(sha256(b"uprof.audit.append").digest()[:8], "big", signed=True)
_INSERT_CHUNK = 500
# Statements every append runs, built once (building one and its cache key costs
# SQLAlchemy more than SQLite spends on the query).
_LAST_LEAF_INDEX = sa.select(sa.func.max(audit_entries.c.leaf_index))
_INSERT_ENTRIES = audit_entries.insert()
_CHECKPOINT_AT = sa.select(audit_checkpoints).where(
    audit_checkpoints.c.tree_size == sa.bindparam("tree_size")
)
_INSERT_NODES = audit_nodes.insert()
_FETCH_CHUNK = 400
_PAGE = 1000
#: How an entry's canonical JSON names its tenant (``AuditLog.tenant_scope``).
_TENANT_MEMBER = '"tenant":"'

NodeKey = tuple[int, int]
_T = TypeVar("_T")


@dataclass(frozen=True)
class AuditRecord:
    """Where an appended entry landed."""

    leaf_index: int
    leaf_hash: bytes


@dataclass(frozen=True)
class StoredEntry:
    """One entry as stored: its index, canonical JSON text and leaf hash."""

    leaf_index: int
    recorded_at: str
    entry_json: str
    leaf_hash: bytes

    @property
    def entry(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.entry_json)
        return parsed


@dataclass(frozen=True)
class TenantScope:
    """Which entries one tenant's reader sees: those naming ``tenant``, and those naming no
    tenant (written before entries named one) at leaf indexes below ``untagged_below``.

    ``AuditLog.tenant_scope`` sets ``untagged_below`` to the log's size when every entry
    that names a tenant names this one (the stores hold one tenant), else to 0: where
    several tenants share the log, an entry that names none is nobody's to read."""

    tenant: str
    untagged_below: int = 0
    #: Whether an entry of the log names another tenant (the stores are shared): what a
    #: read that cannot be kept to one tenant (the residue scan) must refuse.
    shared: bool = False

    def admits(self, stored: StoredEntry) -> bool:
        named = stored.entry.get("tenant")
        if named is None:
            return stored.leaf_index < self.untagged_below
        return bool(named == self.tenant)


@dataclass(frozen=True)
class StoredCheckpoint:
    """A signed checkpoint kept by the log."""

    tree_size: int
    root: bytes
    note: str
    created_at: str


#: ``append_many``'s ``once_by``: field names; a tuple names fields that hold the same
#: value in different shapes (``("dek_commitment", "dek_commitments")``).
OnceBy = Sequence[str | tuple[str, ...]]


@dataclass(frozen=True)
class _PreparedEntry:
    row: dict[str, Any]
    leaf: bytes
    #: The keys of ``once_by``'s values (``once_keys``), () without it.
    identity: tuple[tuple[Any, ...], ...] = ()


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _values(entry: Mapping[str, Any], names: str | tuple[str, ...]) -> list[Any]:
    """The values one ``once_by`` position takes in ``entry``: each named field's value,
    each item of a list value; ``[None]`` when it holds none."""
    found: list[Any] = []
    for name in (names,) if isinstance(names, str) else names:
        value = entry.get(name)
        if isinstance(value, list | tuple):
            found.extend(value)
        elif value is not None:
            found.append(value)
    return found or [None]


def once_keys(entry: Mapping[str, Any], once_by: OnceBy) -> tuple[tuple[Any, ...], ...]:
    """The keys under which ``append_many(..., once_by=once_by)`` knows ``entry``: its
    action, its subject_ref and a value of each ``once_by`` position, one key per
    combination (a list field gives one per item).

    An entry to append is left out when every one of its keys is held (by a stored entry
    or an earlier entry of the batch). A plain field has one value, so this is equality;
    a list field lets one commitment be found among the ``dek_commitments`` of a capture
    request's ``key.created`` entry, and a tuple position reads several field names
    (decision 0085)."""
    keys: list[tuple[Any, ...]] = [(entry.get("action"), entry.get("subject_ref"))]
    for names in once_by:
        keys = [(*key, value) for key in keys for value in _values(entry, names)]
    return tuple(keys)


def _not_yet_written(
    conn: sa.Connection, prepared: Sequence[_PreparedEntry], once_by: OnceBy
) -> list[_PreparedEntry]:
    """The entries whose ``once_keys`` neither the log (read under its write lock) nor
    earlier entries of the batch all hold."""
    seen: set[tuple[Any, ...]] = set()
    groups: dict[tuple[Any, Any], list[_PreparedEntry]] = {}
    for item in prepared:
        groups.setdefault((item.row["action"], item.row["subject_ref"]), []).append(item)
    for (action, subject_ref), items in groups.items():
        same_subject = (
            audit_entries.c.subject_ref.is_(None)
            if subject_ref is None
            else audit_entries.c.subject_ref == subject_ref
        )
        for narrowing in _could_match(items, once_by):
            query = sa.select(audit_entries.c.entry_json).where(
                audit_entries.c.action == action, same_subject, *narrowing
            )
            for text in conn.execute(query).scalars():
                seen |= set(once_keys(json.loads(text), once_by))
    kept = []
    for item in prepared:
        if not all(key in seen for key in item.identity):
            seen |= set(item.identity)
            kept.append(item)
    return kept


def _needle_value(value: Any) -> bool:
    """Whether a ``once_by`` value narrows the read: a string, or a field's integer
    (``"notification_id":42``: a superset, it also finds 420; the parsed values decide)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


#: Values one narrowing query names at most (an OR of more LIKEs is no cheaper, and
#: SQLite bounds an expression's depth at 1,000); more are read in several queries.
_MAX_NEEDLES = 64


def _could_match(
    items: Sequence[_PreparedEntry], once_by: OnceBy
) -> list[list[sa.ColumnElement[bool]]]:
    """Conditions (one query each) that together select every stored entry that may
    match one of ``items``: the canonical text of the values of the first ``once_by``
    position at which every item has only strings or integers (``"request_id":"..."``,
    ``"notification_id":42``, exactly as
    RFC 8785 writes it in ``entry_json``; for a tuple position, which may also be a list,
    the quoted value alone). The subject's other entries of that action (one per erased
    event, say) are then neither sent nor parsed under the write lock; the parsed values
    still decide. ``[[]]``, one unnarrowed query, when no position qualifies."""
    for position, names in enumerate(once_by):
        values = {key[2 + position] for item in items for key in item.identity}
        if not all(_needle_value(v) for v in values):
            continue
        if isinstance(names, str):
            needles = sorted(canonical_bytes({names: v}).decode("utf-8")[1:-1] for v in values)
        else:
            needles = sorted(canonical_bytes([v]).decode("utf-8")[1:-1] for v in values)
        return [
            [
                sa.or_(
                    *(
                        audit_entries.c.entry_json.contains(n, autoescape=True)
                        for n in needles[lo : lo + _MAX_NEEDLES]
                    )
                )
            ]
            for lo in range(0, len(needles), _MAX_NEEDLES)
        ]
    return [[]]


@runtime_checkable
class CheckpointAnchor(Protocol):
    """Where the newest checkpoint a log signed is kept apart from the log (in uprof: the
    key folder, ``audit.keyring.FileKeyRing``), so that a log put back from an older copy
    (or cut, or rewritten below it) is told from one that only grew (bug HE).

    ``anchored_checkpoint`` returns that signed note, or None; ``raise_checkpoint_anchor``
    keeps ``note`` (of ``tree_size`` entries) unless the kept one is at least as large;
    ``forget_checkpoint_anchor`` drops it (``uprof restore`` choosing an older log)."""

    def anchored_checkpoint(self) -> str | None: ...

    def raise_checkpoint_anchor(self, tree_size: int, note: str) -> None: ...

    def forget_checkpoint_anchor(self) -> None: ...


class Retry(Protocol):
    """Runs an append again while it fails with a transient error (``StoreBusyError``,
    ``VersionConflictError``); uprof passes its one retry policy (``uprof.retry``)."""

    def __call__(self, operation: Callable[[], _T], /) -> _T: ...


def run_once(operation: Callable[[], _T], /) -> _T:
    """No retry: the append's transient error reaches the caller."""
    return operation()


class AuditLog:
    """An RFC 9162 Merkle log of audit entries stored in SQL, with C2SP signed checkpoints.

    ``engine`` must have the ``audit.tables`` tables (Alembic in production,
    ``audit.tables.create_tables`` in tests); ``backend`` is its database's
    ``AuditBackend`` (in uprof: ``uprof.backends.backend_for(engine)``). ``origin`` names
    the log in its checkpoints and is the checkpoint key name. ``retry`` runs an append
    again when it met another writer (see ``Retry``; alone, the log tries once). ``clock``
    returns an aware datetime (tests pass a fixed one). ``anchor`` keeps the newest signed
    checkpoint outside the log's database (``CheckpointAnchor``): a log that does not
    extend it is signed no checkpoint and fails ``verify_integrity``.
    """

    def __init__(
        self,
        engine: sa.Engine,
        signing_key: Ed25519PrivateKey | SigningKeys,
        origin: str,
        *,
        backend: AuditBackend,
        retry: Retry = run_once,
        clock: Callable[[], datetime] = _utc_now,
        anchor: CheckpointAnchor | None = None,
    ) -> None:
        self._engine = engine
        self._anchor = anchor
        #: The largest tree size this instance has anchored (no file write below it).
        self._anchored_size = -1
        #: The anchored note last read and its verified (tree size, root).
        self._anchor_seen: tuple[str, tuple[int, bytes]] | None = None
        self._backend = backend
        self._retry = retry
        #: The current key and the keys of its endorsed history (``audit.keyring``).
        self._keys: SigningKeys = (
            StaticSigningKeys(signing_key)
            if isinstance(signing_key, Ed25519PrivateKey)
            else signing_key
        )
        self.origin = check_origin(origin)
        self._clock = clock
        #: (tree size, frontier node hashes) after this instance's last committed append;
        #: reused when the stored size still matches, so an append needs no node reads.
        self._frontier: tuple[int, list[bytes]] | None = None
        #: ``tenant_scope``'s answers so far: each process asks about each entry once.
        #: tenant -> (entries checked, whether none of them names another tenant)
        self._tenants_seen: dict[str, tuple[int, bool]] = {}
        self._tenants_lock = threading.Lock()

    # --- identity -------------------------------------------------------------------------

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The current signing key's public half."""
        return self._keys.current().public_key()

    @property
    def key_id(self) -> str:
        """Hex SHA-256 of the current raw public key (what receipts and exports name)."""
        return key_id(self._keys.current())

    @property
    def keys(self) -> SigningKeys:
        """Where the log's keys come from (the current one, the endorsed history)."""
        return self._keys

    def signing_key(self) -> Ed25519PrivateKey:
        """The current key, for a caller that must make several signatures with one key
        (an export's header names the key its trailer is signed with)."""
        return self._keys.current()

    def trusted_keys(self) -> TrustedKeys:
        """Every key whose signatures this log accepts: the current key's endorsed history,
        as ranges (a rotated-out key only up to where the history says it stopped)."""
        keys = self._keys.trusted()
        return keys if isinstance(keys, TrustedKeys) else TrustedKeys(keys)

    @contextmanager
    def held_head(self) -> Iterator[RetiredAt]:
        """The log's size and root, with its append lock held until the block ends: what a
        key rotation records as where the old key stopped signing (``FileKeyRing.rotate``'s
        ``log_head``). Nothing is appended meanwhile, by any process."""
        with self._write_transaction() as conn:
            size = self._size(conn)
            yield RetiredAt(size, self._root(conn, size))

    # No general "sign these bytes" method: each signed message kind has its own, with a shape
    # that cannot be mistaken for a checkpoint body (which starts with the origin).

    def sign_json(self, obj: Mapping[str, Any], *, key: Ed25519PrivateKey | None = None) -> bytes:
        """Sign the RFC 8785 bytes of a JSON object (receipt bodies); they start with ``{``.
        ``key``: one ``signing_key()`` returned (the body names it), else the current key."""
        return (key or self._keys.current()).sign(canonical_bytes(obj))

    def sign_export_digest(self, digest: bytes, *, key: Ed25519PrivateKey | None = None) -> bytes:
        """Sign ``EXPORT_SIGNATURE_CONTEXT || digest`` (a 32-byte SHA-256 of an export) with
        ``key`` (one ``signing_key()`` returned) or the current key."""
        if len(digest) != 32:
            raise InvalidInputError("an export digest is 32 bytes")
        return (key or self._keys.current()).sign(EXPORT_SIGNATURE_CONTEXT + digest)

    def now(self) -> str:
        """Return the log clock's time in the log's timestamp format."""
        return format_timestamp(self._clock())

    # --- writes ---------------------------------------------------------------------------

    def append(self, entry: Mapping[str, Any]) -> AuditRecord:
        """Validate, store and hash one entry; return its leaf index and hash."""
        return self.append_many([entry])[0]

    def append_many(
        self,
        entries: Iterable[Mapping[str, Any]],
        *,
        once_by: OnceBy = (),
        admitted: Callable[[], None] | None = None,
    ) -> list[AuditRecord]:
        """Append entries atomically at consecutive indexes; all or nothing.

        ``admitted``, when given, is asked under the log's write lock, after every earlier
        append has committed and before these are written; whatever it raises is raised
        and nothing is written, and one that does not answer within
        ``CHECK_UNDER_LOCK_WITHIN_S`` raises StoreUnavailableError (``domain.under_lock``,
        bug VQ). An entry that states a fact which may stop being true while the append
        waits for its turn (a key that stands) is written only if it is true at its place
        in the log (decision 0227-leftovers-of-0218-to-0223).

        With ``once_by`` (field names), an entry is left out when the log already holds an
        entry of the same ``action`` and ``subject_ref`` with the same values of those
        fields (or an earlier entry of the batch does); a list value matches item by item,
        and a tuple of names reads the value from any of them (``once_keys``). The log is
        read under its write lock, so any number of processes appending the same entries
        at once write them once; the records returned are those of the entries written.

        Raises AuditEntryError (nothing written) if any entry is refused.
        """
        prepared = [self._prepare(entry, once_by) for entry in entries]
        if not prepared:
            return []
        return self._retry(lambda: self._write_typed(prepared, tuple(once_by), admitted))

    def holding(
        self,
        action: str,
        subject_refs: Iterable[str],
        field: str,
        values: Iterable[str | int],
    ) -> list[dict[str, Any]]:
        """The stored entries of ``action`` naming one of ``subject_refs`` whose ``field``
        is one of ``values`` (strings or integers), parsed.

        One narrowed read without the write lock (the log is append-only: what it holds
        now it holds later): the indexed ``action`` and ``subject_ref`` columns, then the
        canonical text of each value (``"notification_id":42``, as RFC 8785 writes it in
        ``entry_json``; a superset, the parsed values decide), in queries of at most
        ``_MAX_NEEDLES`` values. What ``append_many(..., once_by=(field,))`` would find,
        for a caller that must know which are held before it builds the entries (the
        extraction worker's reconciliation, decision 0101-capture-accepted-reconciled)."""
        refs = sorted(set(subject_refs))
        wanted = {v for v in values if _needle_value(v)}
        if not refs or not wanted:
            return []
        # Unescaped LIKE patterns of the value's RFC 8785 text (``"notification_id":42``;
        # strings as ``json.dumps`` without ASCII escapes writes them, which is the same
        # text): ``%`` and ``_`` match more, a superset again, and a backslash (an escape
        # in PostgreSQL's LIKE) becomes ``_``. Each query names exactly ``_MAX_NEEDLES``
        # patterns (the last repeated), bound at execution: one statement, compiled once.
        name = json.dumps(field, ensure_ascii=False)
        needles = sorted(
            "%" + f"{name}:{json.dumps(v, ensure_ascii=False)}".replace("\\", "_") + "%"
            for v in wanted
        )
        c = audit_entries.c
        query = sa.select(c.entry_json).where(
            c.action == sa.bindparam("action"),
            c.subject_ref.in_(sa.bindparam("refs", expanding=True)),
            sa.text("(" + " OR ".join(f"entry_json LIKE :n{i}" for i in range(_MAX_NEEDLES)) + ")"),
        )
        found: list[dict[str, Any]] = []
        with self._engine.connect() as conn:
            for lo in range(0, len(needles), _MAX_NEEDLES):
                chunk = needles[lo : lo + _MAX_NEEDLES]
                chunk += [chunk[-1]] * (_MAX_NEEDLES - len(chunk))
                params: dict[str, Any] = {
                    "action": action,
                    "refs": refs,
                    **{f"n{i}": n for i, n in enumerate(chunk)},
                }
                for text in conn.execute(query, params).scalars():
                    entry = json.loads(text)
                    if entry.get(field) in wanted:
                        found.append(entry)
        return found

    def _write_typed(
        self,
        prepared: Sequence[_PreparedEntry],
        once_by: OnceBy = (),
        admitted: Callable[[], None] | None = None,
    ) -> list[AuditRecord]:
        """``_write``, with the driver's transient failures raised as domain errors.

        With ``once_by``, the entries the log holds are left out first without its lock:
        the log is append-only, so what it holds now it holds at the lock too, and the
        read under the lock (which every append of every process waits for) decides only
        the entries still missing. An event erasure's ``key.created`` for a key whose
        creation is on the log, nearly always the case, then costs no read under the lock,
        however many capture requests the subject made (decision 0085)."""
        try:
            if once_by:
                with self._engine.connect() as conn:
                    prepared = _not_yet_written(conn, prepared, once_by)
                if not prepared:
                    return []
            return self._write(prepared, once_by, admitted)
        except sa.exc.IntegrityError as exc:
            # Another writer took these indexes (only without a working lock).
            raise VersionConflictError("another writer took these audit leaf indexes") from exc
        except sa.exc.OperationalError as exc:
            if not self._backend.is_transient_lock(exc.orig):
                raise
            raise StoreBusyError("the audit log is locked by another writer") from exc

    def _prepare(self, entry: Mapping[str, Any], once_by: OnceBy = ()) -> _PreparedEntry:
        validate_entry(entry)
        stored = dict(entry)
        stored["recorded_at"] = normalise_timestamp(
            stored.get("recorded_at") or self._clock(), "recorded_at"
        )
        canonical = canonical_bytes(stored)
        row = {
            "recorded_at": stored["recorded_at"],
            "action": stored["action"],
            "app_id": stored.get("app_id"),
            "subject_ref": stored.get("subject_ref"),
            "entry_json": canonical.decode("utf-8"),
        }
        identity = once_keys(stored, once_by) if once_by else ()
        return _PreparedEntry(row, leaf_hash(canonical), identity)

    def _write(
        self,
        prepared: Sequence[_PreparedEntry],
        once_by: OnceBy = (),
        admitted: Callable[[], None] | None = None,
    ) -> list[AuditRecord]:
        with self._write_transaction() as conn:
            if admitted is not None:
                # Bounded: every audited write of every process waits for this lock (bug VQ).
                asked_within(admitted, CHECK_UNDER_LOCK_WITHIN_S)
            if once_by:
                prepared = _not_yet_written(conn, prepared, once_by)
                if not prepared:
                    return []
            size = self._size(conn)
            cached = self._frontier
            if cached is not None and cached[0] == size:
                # Nobody else appended since our last write: the right edge is still ours.
                frontier = Frontier(size, cached[1])
            else:
                keys = frontier_keys(size)
                known = self._fetch_nodes(conn, keys)
                frontier = Frontier(size, [known[k] for k in keys])
            entry_rows, node_rows, records = [], [], []
            for offset, item in enumerate(prepared):
                index = size + offset
                entry_rows.append({**item.row, "leaf_index": index, "leaf_hash": item.leaf})
                for level, node_index, h in frontier.append(item.leaf):
                    node_rows.append({"level": level, "node_index": node_index, "hash": h})
                records.append(AuditRecord(index, item.leaf))
            for start in range(0, len(entry_rows), _INSERT_CHUNK):
                conn.execute(_INSERT_ENTRIES, entry_rows[start : start + _INSERT_CHUNK])
            for start in range(0, len(node_rows), _INSERT_CHUNK):
                conn.execute(_INSERT_NODES, node_rows[start : start + _INSERT_CHUNK])
            self._frontier = None  # set again only once the transaction has committed
            after = (frontier.size, frontier.hashes())
        self._frontier = after
        return records

    def _write_transaction(self) -> AbstractContextManager[sa.Connection]:
        # The log's write lock: the size read after entering is current (module docstring).
        return self._backend.serialised_transaction(self._engine, _APPEND_LOCK)

    def checkpoint(self) -> str:
        """Sign, store and return a checkpoint note for the current tree size."""
        return self.checkpoint_record().note

    def checkpoint_record(self, *, key: Ed25519PrivateKey | None = None) -> StoredCheckpoint:
        """Like ``checkpoint`` but return the stored record (size, root, note, time).

        ``key``: one ``signing_key()`` returned, for a document that names its key
        (receipt, export, proof) and must carry a checkpoint that key signed even when
        another process rotates the key in between; else the current key.

        A log that has not grown since its size was last signed reuses that stored
        checkpoint and writes nothing (a poller of ``GET /v1/audit/key`` opens no write
        transaction); only a new size is stored, once (``tree_size`` is the table's key:
        of two processes signing one size at once, the second finds the first's row)."""
        # The anchor before the log: whatever it names was committed before it was kept,
        # so the log read next holds at least that much, whoever appends meanwhile.
        anchored = self._anchored()
        with self._engine.connect() as conn:
            size = self._size(conn)
            root = self._root(conn, size)
            self._check_anchor(conn, anchored, size, root)
            row = conn.execute(_CHECKPOINT_AT, {"tree_size": size}).first()
        # The note is deterministic (Ed25519) for one key: signing again costs no write and
        # hands out the current key's signature even if the stored one is an older key's.
        # The size was read before the key: a rotation switches the key file under the
        # append lock, so a size that grew after it comes with the new key here. A captured
        # ``key`` (or a rotation killed before its switch) may still be out of its range:
        # refused here, never handed out as a note every verifier would refuse.
        signer = key or self._keys.current()
        try:
            self.trusted_keys().check_signed_range(signer.public_key(), size, root)
        except VerificationError as exc:
            raise AuditKeyError(
                f"not signing the checkpoint of size {size}: {exc.reason}. The audit key was "
                "rotated while this document was being built (ask again), or a rotation was "
                "killed before its key switch (a restart finishes it)"
            ) from None
        note = sign_checkpoint(signer, self.origin, size, root)
        if row is not None:
            record = self._reused(StoredCheckpoint(**row._asdict()), root, note)
        else:
            record = self._stored_checkpoint(size, root, note)
        if self._anchor is not None and size > self._anchored_size:
            # After the row: a kill in between leaves the anchor behind, never ahead.
            self._anchor.raise_checkpoint_anchor(size, note)
            self._anchored_size = size
        return record

    def check_extends_anchor(self) -> None:
        """Raise ``VerificationError`` when the log does not extend the anchored
        checkpoint (``checkpoint_record``'s check, without signing anything): what a
        start runs, so that nothing is served from a views store put back from an older
        copy (its sign-outs, idempotency answers and rate-limit slots lost with it)."""
        anchored = self._anchored()  # before the log, as in ``checkpoint_record``
        if anchored is None:
            return
        with self._engine.connect() as conn:
            size = self._size(conn)
            root = self._root(conn, size) if size == anchored[0] else b""
            self._check_anchor(conn, anchored, size, root)

    def reanchor(self) -> None:
        """Forget the anchored checkpoint: the operator put an older log in place on
        purpose (``uprof restore`` taking a backup's log); its next checkpoint anchors."""
        if self._anchor is not None:
            self._anchor.forget_checkpoint_anchor()
        self._anchored_size = -1

    def _anchored(self) -> tuple[int, bytes] | None:
        """The anchored checkpoint's (tree size, root), its signature checked; None
        without an anchor. Read it *before* the log (see ``checkpoint_record``)."""
        note = None if self._anchor is None else self._anchor.anchored_checkpoint()
        if note is None:
            return None
        cached = self._anchor_seen
        if cached is not None and cached[0] == note:
            return cached[1]  # verified before (each process verifies each note once)
        # The log's own anchor (its key folder's), not a statement handed in: a retired
        # key's note below its point needs no rotation proof here (the log is compared
        # with it next).
        body = verify_checkpoint(
            note, self.trusted_keys(), self.origin, rotation_proof=HELD_BY_READER
        )
        self._anchor_seen = (note, body)
        return body

    def _check_anchor(
        self, conn: sa.Connection, anchored: tuple[int, bytes] | None, size: int, root: bytes
    ) -> None:
        """Refuse a log that does not extend the anchored checkpoint (``CheckpointAnchor``):
        its newest entries were lost (an older copy put back, the tail cut) or the entries
        that checkpoint covers were rewritten."""
        if anchored is None:
            return
        anchored_size, anchored_root = anchored
        if anchored_size > size:
            raise VerificationError(
                f"the audit log holds {size} entries, but this log's key signed a checkpoint "
                f"of {anchored_size}: the log was rolled back (put back from an older copy) "
                "or its newest entries were deleted; refusing to sign a tree that forks it"
            )
        found = root if anchored_size == size else self._root(conn, anchored_size)
        if found != anchored_root:
            raise VerificationError(
                f"the first {anchored_size} entries of the audit log are not those of the "
                "checkpoint this log's key signed: the log was rewritten or replaced by "
                "another (rolled back, then appended to); refusing to sign a tree that forks it"
            )

    def _stored_checkpoint(self, size: int, root: bytes, note: str) -> StoredCheckpoint:
        record = StoredCheckpoint(size, root, note, self.now())
        try:
            # Flushed, with every entry committed before it: the key folder's anchor,
            # raised next and flushed, must never name entries a power cut could still
            # take from the log (the views store does not flush each commit; review of 0139).
            with self._backend.flushed_transaction(self._engine) as conn:
                conn.execute(
                    audit_checkpoints.insert().values(
                        tree_size=size, root=root, note=note, created_at=record.created_at
                    )
                )
        except sa.exc.IntegrityError:
            # Another process stored this size between our read and our insert.
            stored = self._checkpoint_at(size)
            if stored is None:
                raise
            return self._reused(stored, root, note)
        return record

    @staticmethod
    def _reused(stored: StoredCheckpoint, root: bytes, note: str) -> StoredCheckpoint:
        """The stored checkpoint of the current size, with the current key's note."""
        if stored.root != root:
            raise VerificationError(
                f"stored checkpoint for tree size {stored.tree_size} has a different root "
                "than the tree recomputed from the log: the log or its checkpoints were altered"
            ) from None
        # Same size signed before (perhaps under an older key): the new note is just as
        # valid for this root; keep the stored record and hand out the current signature.
        return StoredCheckpoint(stored.tree_size, root, note, stored.created_at)

    # --- reads ----------------------------------------------------------------------------

    def size(self) -> int:
        """Return the number of entries (the next leaf index)."""
        with self._engine.connect() as conn:
            return self._size(conn)

    def root(self, tree_size: int | None = None) -> bytes:
        """Return the Merkle root of the first ``tree_size`` entries (default: all)."""
        with self._engine.connect() as conn:
            size = self._checked_size(conn, tree_size)
            return self._root(conn, size)

    def inclusion_proof(self, leaf_index: int, tree_size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 inclusion proof of ``leaf_index`` in the tree of ``tree_size``."""
        return self.inclusion_proofs([leaf_index], tree_size)[0]

    def inclusion_proofs(
        self, leaf_indexes: Sequence[int], tree_size: int | None = None
    ) -> list[list[bytes]]:
        """Return inclusion proofs for many leaves, fetching the nodes they need in bulk."""
        with self._engine.connect() as conn:
            size = self._checked_size(conn, tree_size)
            for index in leaf_indexes:
                if not 0 <= index < size:
                    raise InvalidInputError(
                        f"leaf_index {index} is outside the tree of size {size}"
                    )
            return self._with_nodes(
                conn, lambda node: [inclusion_path(node, i, size) for i in leaf_indexes]
            )

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """Return the RFC 9162 consistency proof from ``old_size`` to ``new_size``."""
        with self._engine.connect() as conn:
            size = self._checked_size(conn, new_size)
            if not 0 <= old_size <= size:
                raise InvalidInputError(f"old_size {old_size} is outside 0..{size}")
            return self._with_nodes(conn, lambda node: consistency_path(node, old_size, size))

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        """Return the stored checkpoint with the largest tree size, or None."""
        query = sa.select(audit_checkpoints).order_by(audit_checkpoints.c.tree_size.desc()).limit(1)
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else StoredCheckpoint(**row._asdict())

    def checkpoints(self) -> list[StoredCheckpoint]:
        """Return every stored checkpoint, oldest first."""
        query = sa.select(audit_checkpoints).order_by(audit_checkpoints.c.tree_size)
        with self._engine.connect() as conn:
            return [StoredCheckpoint(**row._asdict()) for row in conn.execute(query)]

    def entries(
        self,
        subject_ref: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        *,
        tree_size: int | None = None,
        after_leaf: int = -1,
        page_size: int = _PAGE,
        scope: TenantScope | None = None,
    ) -> Iterator[StoredEntry]:
        """Yield stored entries in leaf order, filtered; ``since`` inclusive, ``until`` exclusive.

        ``tree_size`` limits the scan to the first ``tree_size`` leaves (an export's checkpoint);
        ``after_leaf`` starts it after that leaf index (a page's keyset position); ``scope``
        keeps only the entries a tenant's reader sees (``tenant_scope``), in the query.
        Pages through the table by leaf index, so a long scan holds no connection between pages.
        """
        conditions = []
        if subject_ref is not None:
            conditions.append(audit_entries.c.subject_ref == subject_ref)
        if app_id is not None:
            conditions.append(audit_entries.c.app_id == app_id)
        if action is not None:
            conditions.append(audit_entries.c.action == action)
        if since is not None:
            conditions.append(audit_entries.c.recorded_at >= normalise_timestamp(since, "since"))
        if until is not None:
            conditions.append(audit_entries.c.recorded_at < normalise_timestamp(until, "until"))
        if tree_size is not None:
            conditions.append(audit_entries.c.leaf_index < tree_size)
        if scope is not None:
            conditions.append(self._in_scope(scope))
        columns = (
            audit_entries.c.leaf_index,
            audit_entries.c.recorded_at,
            audit_entries.c.entry_json,
            audit_entries.c.leaf_hash,
        )
        after = after_leaf
        page_size = max(1, min(page_size, _PAGE))
        while True:
            query = (
                sa.select(*columns)
                .where(audit_entries.c.leaf_index > after, *conditions)
                .order_by(audit_entries.c.leaf_index)
                .limit(page_size)
            )
            with self._engine.connect() as conn:
                rows = conn.execute(query).all()
            for row in rows:
                yield StoredEntry(
                    row.leaf_index, row.recorded_at, row.entry_json, bytes(row.leaf_hash)
                )
            if len(rows) < page_size:
                return
            after = rows[-1].leaf_index

    def tenant_scope(self, tenant: str) -> TenantScope:
        """The entries ``tenant``'s readers see (``TenantScope``): its own, plus the entries
        naming no tenant when no entry of the log names another tenant.

        Asks the database whether an entry appended since this instance last asked names
        another tenant (all of them, the first time; never again once one did: the log is
        append-only). In an entry the log stores (allowlisted, canonical), the text
        ``"tenant":"`` occurs only as its ``tenant`` member, whose token value holds no
        quote, so a case-sensitive substring test of ``"tenant":"T"`` is exact."""
        with self._tenants_lock:
            upto, alone = self._tenants_seen.get(tenant, (0, True))
            if alone:
                with self._engine.connect() as conn:
                    size = self._size(conn)  # every entry below it is committed
                    if size > upto:
                        alone = conn.execute(self._other_tenant(tenant, upto, size)).first() is None
                        upto = size
                self._tenants_seen[tenant] = (upto, alone)
            return TenantScope(tenant, upto if alone else 0, shared=not alone)

    def _position(self, needle: str) -> sa.ColumnElement[int]:
        """Where ``needle`` starts in an entry's JSON (1-based; 0: absent), as the
        backend finds it: case-sensitive and without wildcards."""
        return self._backend.text_position(audit_entries.c.entry_json, needle)

    def _other_tenant(self, tenant: str, start: int, stop: int) -> sa.Select[Any]:
        """An entry in ``[start, stop)`` that names a tenant other than ``tenant``."""
        return (
            sa.select(audit_entries.c.leaf_index)
            .where(
                audit_entries.c.leaf_index >= start,
                audit_entries.c.leaf_index < stop,
                self._position(_TENANT_MEMBER) > 0,
                self._position(f'{_TENANT_MEMBER}{tenant}"') == 0,
            )
            .limit(1)
        )

    def _in_scope(self, scope: TenantScope) -> sa.ColumnElement[bool]:
        """``scope.admits`` as a condition of the query (the text test of ``tenant_scope``)."""
        return sa.or_(
            self._position(f'{_TENANT_MEMBER}{scope.tenant}"') > 0,
            sa.and_(
                self._position(_TENANT_MEMBER) == 0,
                audit_entries.c.leaf_index < scope.untagged_below,
            ),
        )

    def verify_integrity(self, *, against_anchor: bool = True) -> int:
        """Recompute the whole log from ``entry_json`` and check every stored hash and checkpoint.

        Returns the number of entries checked; raises VerificationError at the first mismatch
        (a leaf hash, a perfect node, a gap in indexes, or a checkpoint root or signature).
        ``against_anchor=False``: not compared with the anchored checkpoint, for a log the
        operator puts in place of the anchored one (a restore, before ``reanchor``).
        """
        checkpoints = {c.tree_size: c for c in self.checkpoints()}
        # Any key of the endorsed history signed the checkpoints of its time; a key the
        # history does not name signed none of them.
        public_key = self.trusted_keys()
        frontier = Frontier()
        pending: dict[NodeKey, bytes] = {}

        def check_pending(conn: sa.Connection) -> None:
            stored = self._fetch_nodes(conn, list(pending))
            for key, expected in pending.items():
                if stored[key] != expected:
                    raise VerificationError(f"stored Merkle node {key} does not match the leaves")
            pending.clear()

        # Before the log, as in ``checkpoint_record``.
        anchored = self._anchored() if against_anchor else None
        self._check_checkpoint(checkpoints.get(0), EMPTY_ROOT, public_key)
        # Each rotation point the key history records, compared with the root recomputed
        # there (bug MQ): the anchor catches a log that forks it only where one is kept.
        public_key.check_log_root(0, EMPTY_ROOT)
        for stored_entry in self.entries():
            index = frontier.size
            if stored_entry.leaf_index != index:
                raise VerificationError("leaf indexes are not dense", leaf_index=index)
            leaf = leaf_hash(stored_entry.entry_json.encode("utf-8"))
            if leaf != stored_entry.leaf_hash:
                raise VerificationError(
                    "stored leaf hash does not match the entry", leaf_index=index
                )
            for level, node_index, h in frontier.append(leaf):
                pending[(level, node_index)] = h
            if len(pending) >= _FETCH_CHUNK:
                with self._engine.connect() as conn:
                    check_pending(conn)
            root = frontier.root()
            self._check_checkpoint(checkpoints.get(frontier.size), root, public_key)
            public_key.check_log_root(frontier.size, root)
        if pending:
            with self._engine.connect() as conn:
                check_pending(conn)
        if any(size > frontier.size for size in checkpoints):
            raise VerificationError("a stored checkpoint covers more entries than the log holds")
        with self._engine.connect() as conn:
            self._check_anchor(conn, anchored, frontier.size, frontier.root())
        return frontier.size

    def _check_checkpoint(
        self, stored: StoredCheckpoint | None, root: bytes, public_key: Sequence[Ed25519PublicKey]
    ) -> None:
        if stored is None:
            return
        if stored.root != root:
            raise VerificationError(
                f"stored checkpoint for tree size {stored.tree_size} has a different root"
            )
        # Its root was just recomputed from the log itself: that is this note's proof.
        size, note_root = verify_checkpoint(
            stored.note, public_key, self.origin, rotation_proof=HELD_BY_READER
        )
        if (size, note_root) != (stored.tree_size, root):
            raise VerificationError(f"checkpoint note for tree size {stored.tree_size} disagrees")

    # --- internals ------------------------------------------------------------------------

    def _checkpoint_at(self, tree_size: int) -> StoredCheckpoint | None:
        with self._engine.connect() as conn:
            row = conn.execute(_CHECKPOINT_AT, {"tree_size": tree_size}).first()
        return None if row is None else StoredCheckpoint(**row._asdict())

    @staticmethod
    def _size(conn: sa.Connection) -> int:
        last = conn.execute(_LAST_LEAF_INDEX).scalar()
        return 0 if last is None else int(last) + 1

    def _checked_size(self, conn: sa.Connection, tree_size: int | None) -> int:
        size = self._size(conn)
        if tree_size is None:
            return size
        if not 0 <= tree_size <= size:
            raise InvalidInputError(f"tree_size {tree_size} is outside 0..{size}")
        return tree_size

    def _root(self, conn: sa.Connection, size: int) -> bytes:
        return self._with_nodes(conn, lambda node: tree_hash(node, size))

    def _with_nodes(self, conn: sa.Connection, build: Callable[[NodeGetter], _T]) -> _T:
        """Run ``build`` twice: once to learn which perfect nodes it reads, then with them fetched.

        The shape of a proof depends only on indexes and sizes, never on hash values, so a dry
        run with placeholder hashes names every node; one bulk fetch then serves the real run.
        """
        wanted: set[NodeKey] = set()
        placeholder = bytes(32)

        def record(level: int, index: int) -> bytes:
            wanted.add((level, index))
            return placeholder

        build(record)
        nodes = self._fetch_nodes(conn, list(wanted))
        return build(lambda level, index: nodes[(level, index)])

    @staticmethod
    def _fetch_nodes(conn: sa.Connection, keys: Sequence[NodeKey]) -> dict[NodeKey, bytes]:
        """Fetch perfect nodes: level 0 from the leaves, higher levels from ``audit_nodes``."""
        found: dict[NodeKey, bytes] = {}
        leaves = sorted({index for level, index in keys if level == 0})
        inner = sorted({(level, index) for level, index in keys if level > 0})
        for start in range(0, len(leaves), _FETCH_CHUNK):
            chunk = leaves[start : start + _FETCH_CHUNK]
            query = sa.select(audit_entries.c.leaf_index, audit_entries.c.leaf_hash).where(
                audit_entries.c.leaf_index.in_(chunk)
            )
            for index, h in conn.execute(query):
                found[(0, index)] = bytes(h)
        for start in range(0, len(inner), _FETCH_CHUNK):
            inner_chunk = inner[start : start + _FETCH_CHUNK]
            by_level: dict[int, list[int]] = {}
            for level, index in inner_chunk:
                by_level.setdefault(level, []).append(index)
            condition = sa.or_(
                *(
                    sa.and_(audit_nodes.c.level == level, audit_nodes.c.node_index.in_(indexes))
                    for level, indexes in by_level.items()
                )
            )
            query = sa.select(audit_nodes.c.level, audit_nodes.c.node_index, audit_nodes.c.hash)
            for level, index, h in conn.execute(query.where(condition)):
                found[(level, index)] = bytes(h)
        missing = [key for key in keys if key not in found]
        if missing:
            raise VerificationError(
                f"the log is missing Merkle nodes {missing[:5]}: its tables are incomplete"
            )
        return found
