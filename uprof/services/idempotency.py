"""Idempotent writes (I14): one place that claims, replays and forgets request keys.

A caller that may retry a write sends an idempotency key with it (REST
``Idempotency-Key``; ``idempotency_key`` in the SDK, MCP and import records). How a
retry gets the effect of one write and the first answer:

1. **Claim** (before the write): insert ``(token, body hash)`` under a unique key.
   ``token`` is a keyed hash of (tenant, app, key): keys are per app, so app B
   reusing app A's key claims another row and never sees A's answer. The same key
   with another body (or another operation) is refused with
   ``IdempotencyKeyReusedError`` (409 ``idempotency_key_reused``). A row already
   answered is replayed as stored.
2. **Write**: the kernel passes ``token`` into the subject's stream, where the write
   records it (``RequestsRecorded``) in the same save as its events. A second writer
   with the same token — a concurrent duplicate in another server process, or a
   retry after a crash between claim and answer — loses the stream's version race
   (the event store's unique ``(stream, version)``), reloads, finds the token and
   writes nothing. So a claimed-but-unanswered key never blocks (no lease to wait
   out: the next retry simply runs) and never writes twice.
3. **Answer**: the first answer stored wins; every caller of one key returns it, so
   concurrent duplicates get byte-identical responses.
4. **Replay, decided again**: a retry of an answered key runs the write again before
   the stored answer is returned. Everything a fresh call is refused for is asked
   again as it stands now (the app's policy, its API key at the edge, the subject's
   consent, an erasure) and refused the same way, audited; only a call that would be
   let through gets the first answer. The stream holds the token (it outlives the
   row: the row's retention starts at the claim, before the write), so the run
   writes nothing. The kernel audits each replay (``request.replayed``).

5. **One at a time, where the stream cannot arbitrate** (``SERIALIZED``): a withdrawal
   with erase spans the subject's stream, the key store, the ledger and the audit log,
   so two runs of one key at once made two erasure requests (bug JG). Such a write
   holds the deployment's lock of its key (``turn``: an advisory lock on PostgreSQL,
   across hosts; a file lock on SQLite) from its claim to its answer. Each key has a
   lock of its own (``turn_name``), so another key's request never waits (bug KC). A duplicate waits
   up to ``in_progress_wait_s`` for it, then claims: it finds the answer (a replay), or
   a claim whose writer died (the lock dies with its holder, kill -9 included) and runs
   as above. A first still running past the wait is answered ``RequestInProgressError``
   (409 ``request_in_progress``, Retry-After), naming the key; nothing is written.

A write that fails (consent refused, bad input) releases its claim: nothing was
written, and the caller may fix the cause and retry with the same key.

What is stored holds no personal plaintext: the key is kept only as a keyed hash,
the body only as a keyed hash (a plain hash of a small body such as a consent
grant could be guessed back), and the answer holds ids and counts only (capture
ids, notification ids, the subject's pseudonym, consent records, an erasure
receipt without the subject's nonce: ``NEVER_KEPT``). Rows expire after
``retention_s`` (default 24 h) and are purged as claims arrive, so the table stays
bounded by the write rate times the retention.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from domain.errors import (
    IdempotencyKeyReusedError,
    InvalidInputError,
    RequestInProgressError,
    SubjectErasedError,
)
from domain.naming import NAMING_CONVENTION

#: The REST header (and the field name it is reported under).
HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
#: Default retention of keys and their answers.
DEFAULT_RETENTION_S = 24 * 3600.0
#: Purge expired rows at most this often per process.
PURGE_EVERY_S = 60.0
#: Operations whose duplicates run one at a time (module doc, 5): a withdrawal with
#: erase is an erasure, which the subject's stream alone cannot make once (bug JG).
SERIALIZED = frozenset({"consent.withdraw"})
#: How long a duplicate of a ``SERIALIZED`` write waits for its first by default
#: (the setting ``request_in_progress_wait_s``).
DEFAULT_IN_PROGRESS_WAIT_S = 10.0

#: A deployment's exclusive lock by name, held until the block ends or its holder dies,
#: with the previous release's lock of the second name held shared beside it; waits at
#: most the seconds given and yields whether it holds both (``Backend.named_lock`` bound
#: to the store's engine).
Turn = Callable[[str, str, float], AbstractContextManager[bool]]
#: The previous release's turn of a key (decision 0158) was one of this many locks,
#: shared by the keys hashed onto it and taken exclusively. A process of that release
#: may still serve requests during an upgrade (docs/operations.md), so a turn also holds
#: the key's one, shared: the old process and this release never run one key at once
#: (bug KJ). Drop it once no deployment can run that release beside this one.
PREVIOUS_RELEASE_TURN_SHARDS = 256

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

#: One row per (app, key). ``state`` is ``pending`` from the claim until the answer
#: is stored, then ``done``. Times are epoch milliseconds (one type on both backends).
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("token", sa.String(64), primary_key=True),
    sa.Column("app_id", sa.String(128), nullable=False),
    sa.Column("operation", sa.String(32), nullable=False),
    sa.Column("body_hash", sa.String(64), nullable=False),
    sa.Column("state", sa.String(8), nullable=False),
    sa.Column("status", sa.Integer, nullable=True),
    sa.Column("response", sa.Text, nullable=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("expires_ms", sa.BigInteger, nullable=False, index=True),
)


#: Answer fields given to the first caller only, and kept as "" for replays: a subject's
#: erasure-receipt nonce is the subject's alone (docs/audit-format.md §7); kept beside the
#: receipt's commitment, it would let anyone reading this table test guessed subject
#: references against it, for as long as the row lives.
NEVER_KEPT = frozenset({"subject_nonce_hex"})


def _without_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "" if k in NEVER_KEPT else _without_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


#: True while a replay runs its write again (``IdempotencyStore.run``). The write must then
#: find its token in the subject's stream; a stream without it is another subject's (the
#: one answered was erased and its name re-created), and nothing may be written there.
replaying: ContextVar[bool] = ContextVar("uprof_idempotency_replaying", default=False)

#: When the client of the request being served stops waiting for its answer
#: (``time.monotonic``), when it said how long it waits (``Prefer: wait``, RFC 7240); None:
#: not said. A duplicate waits for its first request no longer than that: past the
#: client's own timeout the 409 would go to nobody, and the abandoned wait would hold a
#: server worker (bug LV); each later wait of the request takes what is left
#: (``client_wait_left``).
client_wait_ends: ContextVar[float | None] = ContextVar("uprof_client_wait_ends", default=None)


def client_wait_left() -> float | None:
    """What is left of the client's wait (``client_wait_ends``) for the request being served,
    in seconds (0 once past it); None when the client did not say. Each wait of a
    request (the key's turn, then the consent's erasure turn) takes from one budget, so
    that together they end within what the client waits."""
    ends = client_wait_ends.get()
    return None if ends is None else max(0.0, ends - time.monotonic())


def refuse_unrecorded(replay: bool | None = None) -> None:
    """Call where a keyed write found no recorded token, before it writes: a replay
    (``replay``, or the context's ``replaying``) is refused, writing nothing."""
    if replaying.get() if replay is None else replay:
        raise SubjectErasedError(
            "the subject this request was answered for was erased (its name now stands "
            "for another subject); nothing was written"
        )


def check_key(key: str) -> str:
    """Validate an idempotency key; the error names the header."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInputError(f"{HEADER} must be 1 to {MAX_KEY_LENGTH} characters", field=HEADER)
    if any(not (0x21 <= ord(ch) <= 0x7E) for ch in key):
        raise InvalidInputError(
            f"{HEADER} must be visible ASCII characters (no spaces)", field=HEADER
        )
    return key


@dataclass(frozen=True)
class Outcome:
    """The answer to a keyed write: the stored response, and whether it was a replay."""

    response: dict[str, Any]
    status: int
    replayed: bool


#: What a keyed write runs: given the token, do the write, return (response, status).
Execute = Callable[[str], tuple[dict[str, Any], int]]


class IdempotencyStore:
    """Claims, answers and expiry of idempotency keys, per app, in one table."""

    def __init__(
        self,
        engine: sa.Engine,
        secret: bytes,
        *,
        tenant: str,
        retention_s: float = DEFAULT_RETENTION_S,
        clock_ms: Callable[[], int] | None = None,
        turn: Turn | None = None,
        in_progress_wait_s: float = DEFAULT_IN_PROGRESS_WAIT_S,
    ) -> None:
        if len(secret) < 32:
            raise ValueError("the idempotency secret must be at least 32 bytes")
        self._engine = engine
        self._token_key = hmac.new(secret, b"uprof/idempotency/token/1", hashlib.sha256).digest()
        self._body_key = hmac.new(secret, b"uprof/idempotency/body/1", hashlib.sha256).digest()
        self._tenant = tenant
        self.retention_s = retention_s
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._purge_lock = threading.Lock()
        self._last_purge = 0.0
        self._turn = turn
        self.in_progress_wait_s = in_progress_wait_s

    # ------------------------------------------------------------------ hashes

    def token(self, app_id: str, key: str, *, namespace: str = "key") -> str:
        """The per-app token of a key (also what the subject's stream records)."""
        msg = "\x1f".join((self._tenant, app_id, namespace, key)).encode()
        return hmac.new(self._token_key, msg, hashlib.sha256).hexdigest()

    def body_hash(self, operation: str, body: Mapping[str, Any]) -> str:
        canonical = json.dumps(
            {"operation": operation, "body": body},
            sort_keys=True,
            separators=(",", ":"),
            default=str,
            ensure_ascii=False,
        )
        return hmac.new(self._body_key, canonical.encode(), hashlib.sha256).hexdigest()

    # --------------------------------------------------------------------- run

    def run(
        self,
        app_id: str,
        key: str,
        operation: str,
        body: Mapping[str, Any],
        execute: Execute,
    ) -> Outcome:
        """Run a keyed write once: claim, write (passing the token), store the answer."""
        token = self.token(app_id, check_key(key))
        body_hash = self.body_hash(operation, body)
        with self._one_at_a_time(token, operation):
            return self._run(token, app_id, operation, body_hash, execute)

    @staticmethod
    def turn_name(token: str) -> str:
        """The name of a key's turn: one lock per key (per tenant and app: the token is
        their keyed hash), never shared with another key. Decision 0158 hashed keys onto
        256 shared locks, and a stranger's request on the same lock waited for, and past
        10 s was refused by, another subject's erasure (bug KC)."""
        return f"idempotency-turn-{token}"

    @staticmethod
    def previous_release_turn_name(token: str) -> str:
        """The name of a key's turn in the previous release (decision 0158)."""
        return f"idempotency-turn-{int(token[:8], 16) % PREVIOUS_RELEASE_TURN_SHARDS}"

    @contextmanager
    def _one_at_a_time(self, token: str, operation: str) -> Iterator[None]:
        """Hold the key's turn from claim to answer for a ``SERIALIZED`` operation
        (module doc, 5); refuse with ``RequestInProgressError`` past the wait."""
        if self._turn is None or operation not in SERIALIZED:
            yield
            return
        previous = self.previous_release_turn_name(token)
        wait_s = self.in_progress_wait_s
        client = client_wait_left()
        if client is not None:
            wait_s = min(wait_s, client)
        with self._turn(self.turn_name(token), previous, wait_s) as held:
            if not held:
                raise RequestInProgressError(
                    f"the first request with this {HEADER} is still running; "
                    "nothing was done by this one",
                    field=HEADER,
                )
            yield

    def _run(
        self, token: str, app_id: str, operation: str, body_hash: str, execute: Execute
    ) -> Outcome:
        stored = self._claim(token, app_id, operation, body_hash)
        if stored is not None:
            # A replay is decided like a fresh call: the write runs again with the same
            # token, so the policy, the key, the consent gate and erasure are asked as
            # they stand now, and a refusal is raised (and audited) as for a fresh call;
            # the subject's stream holds the token, so the run writes nothing (a stream
            # without it refuses: ``refuse_unrecorded``).
            mark = replaying.set(True)
            try:
                execute(token)
            finally:
                replaying.reset(mark)
            return stored
        try:
            response, status = execute(token)
        except BaseException:
            self._release(token, body_hash)
            raise
        return self._answer(token, body_hash, response, status)

    def _claim(self, token: str, app_id: str, operation: str, body_hash: str) -> Outcome | None:
        """Claim the key; return the stored answer if there is one (a replay)."""
        self._maybe_purge()
        t = idempotency_keys
        for _ in range(3):
            now = self._clock_ms()
            try:
                with self._engine.begin() as conn:
                    conn.execute(
                        t.insert().values(
                            token=token,
                            app_id=app_id,
                            operation=operation,
                            body_hash=body_hash,
                            state="pending",
                            created_ms=now,
                            expires_ms=now + int(self.retention_s * 1000),
                        )
                    )
                return None
            except sa.exc.IntegrityError:
                pass
            with self._engine.connect() as conn:
                row = conn.execute(sa.select(t).where(t.c.token == token)).first()
                conn.rollback()  # the read's transaction ends here, before any write
                if row is not None and row.expires_ms <= now:
                    # Expired: the key may name a new request now. One conditional DELETE
                    # in a transaction of its own, never a write in the read's: on SQLite
                    # a transaction that has read and then writes after another process's
                    # commit to the views file (every rate-limited request commits there)
                    # fails with SQLITE_BUSY_SNAPSHOT, which no busy timeout retries. The
                    # condition does what the read did: a row another process claimed
                    # anew meanwhile has not expired and stays (decision
                    # 0118-idempotency-reclaim-and-worker-collisions).
                    with conn.begin():
                        conn.execute(t.delete().where(t.c.token == token, t.c.expires_ms <= now))
                    continue
            if row is None:
                continue  # released between our insert and our read: claim again
            if row.body_hash != body_hash:
                raise IdempotencyKeyReusedError(
                    f"{HEADER} was already used by this app for a different request",
                    field=HEADER,
                )
            if row.state == "done":
                return Outcome(json.loads(row.response), int(row.status), replayed=True)
            # Claimed and not answered: its writer is still running, or died. Run the
            # write too; the subject's stream lets only one of them write (module doc).
            return None
        raise IdempotencyKeyReusedError(
            f"{HEADER} is being claimed and released repeatedly", field=HEADER
        )

    def _answer(self, token: str, body_hash: str, response: dict[str, Any], status: int) -> Outcome:
        t = idempotency_keys
        first = json.dumps(response, sort_keys=True, separators=(",", ":"), default=str)
        text = json.dumps(
            _without_secrets(json.loads(first)), sort_keys=True, separators=(",", ":")
        )
        with self._engine.begin() as conn:
            done = conn.execute(
                t.update()
                .where(t.c.token == token, t.c.body_hash == body_hash, t.c.state == "pending")
                .values(state="done", status=status, response=text)
            ).rowcount
            if not done:
                row = conn.execute(sa.select(t).where(t.c.token == token)).first()
                if row is not None and row.state == "done" and row.body_hash == body_hash:
                    # Another caller of this key answered first: everyone returns that.
                    return Outcome(json.loads(row.response), int(row.status), replayed=True)
        # Stored (or the row expired meanwhile): this answer stands. Round-trip it
        # through JSON so the first caller sees what a replay will (its secrets aside).
        return Outcome(json.loads(first), status, replayed=False)

    def _release(self, token: str, body_hash: str) -> None:
        t = idempotency_keys
        with self._engine.begin() as conn:
            conn.execute(
                t.delete().where(
                    t.c.token == token, t.c.body_hash == body_hash, t.c.state == "pending"
                )
            )

    # ------------------------------------------------------------------ expiry

    def purge(self) -> int:
        """Delete expired keys; returns how many went."""
        t = idempotency_keys
        with self._engine.begin() as conn:
            gone = conn.execute(t.delete().where(t.c.expires_ms <= self._clock_ms())).rowcount
        return int(gone or 0)

    def forget_answers(self) -> int:
        """Delete every key and its answer; returns how many went. For views rebuilt
        because they were ahead of their log (``recovery.rebuild_views_ahead_of_log``):
        this table sits beside the views, so it may hold answers to writes the log lacks,
        and replaying one would refuse a retry whose write never happened. Forgotten, a
        retry runs as a first call, and the subject's stream (which holds the token of
        every write the log kept) still lets nothing be written twice."""
        with self._engine.begin() as conn:
            gone = conn.execute(idempotency_keys.delete()).rowcount
        return int(gone or 0)

    def _maybe_purge(self) -> None:
        now = time.monotonic()
        if now - self._last_purge < PURGE_EVERY_S:
            return
        with self._purge_lock:
            if now - self._last_purge < PURGE_EVERY_S:
                return
            self._last_purge = now
        self.purge()

    def count(self) -> int:
        with self._engine.connect() as conn:
            query = sa.select(sa.func.count()).select_from(idempotency_keys)
            return int(conn.execute(query).scalar_one())
