"""The one table from uprof errors to HTTP statuses, and the errors only the edge raises.

STYLE P7: services raise ``domain.errors`` classes; this module alone decides what
status each becomes. The SDK's embedded mode uses the same table, so a caller sees
the same failure whether it talks to the server or to a kernel in its own process.

Edge-only errors (``EdgeError``) are the ones no service can raise: a missing or
revoked API key (401), a role the key lacks (403), a body over the size limit (413).
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field

import eventsourcing.persistence as es_persistence
import sqlalchemy as sa

from domain.errors import (
    CaptureBackloggedError,
    ConcurrencyConflictError,
    ConsentNotFoundError,
    ConsentRequiredError,
    EmbedderMismatchError,
    ErasureIncompleteError,
    ErasureRolledBackError,
    EvidenceError,
    IdempotencyKeyReusedError,
    IdentityError,
    IntentNotFoundError,
    IntentTransitionError,
    InvalidInputError,
    ModelUnavailableError,
    PermissionDeniedError,
    RateLimitUnavailableError,
    ReadRecordingError,
    ReadTimeoutError,
    RequestInProgressError,
    StoredDataDamagedError,
    StoresLostError,
    StoreUnavailableError,
    SubjectErasedError,
    SubjectNotFoundError,
    UprofError,
)
from uprof.backends import SchemaLockWaitError
from uprof.backends.damage import log_store_damage, store_damage
from uprof.backends.sqlite import sqlite_did_not_answer
from uprof.facade import PolicyStoreError
from uprof.schemas.api import ErrorBody, ErrorOut, FieldProblem

_log = logging.getLogger(__name__)

#: (error class, HTTP status, stable error code); first match wins, subclasses first.
STATUS_TABLE: tuple[tuple[type[UprofError], int, str], ...] = (
    (InvalidInputError, 422, "invalid_input"),
    (EvidenceError, 422, "evidence_invalid"),
    (IdentityError, 422, "identity_unresolved"),
    (ConsentRequiredError, 403, "consent_required"),
    (PermissionDeniedError, 403, "permission_denied"),
    # The code REST's own check of a consent id answers with (``scoped.py``).
    (ConsentNotFoundError, 404, "consent_not_found"),
    (IntentNotFoundError, 404, "intent_not_found"),
    (SubjectNotFoundError, 404, "subject_not_found"),
    (SubjectErasedError, 410, "subject_erased"),
    (IntentTransitionError, 409, "intent_transition"),
    (ReadTimeoutError, 503, "read_timeout"),
    (ReadRecordingError, 503, "read_not_recorded"),
    (CaptureBackloggedError, 503, "capture_backlogged"),
    (RequestInProgressError, 409, "request_in_progress"),
    (ConcurrencyConflictError, 409, "conflict_retry"),
    (IdempotencyKeyReusedError, 409, "idempotency_key_reused"),
    (ErasureIncompleteError, 503, "erasure_incomplete"),
    (ErasureRolledBackError, 409, "erasure_rolled_back"),
    (EmbedderMismatchError, 503, "embedder_mismatch"),
    (ModelUnavailableError, 503, "model_unavailable"),
    (StoresLostError, 503, "stores_lost"),
    (RateLimitUnavailableError, 503, "rate_limit_unavailable"),
    # Temporary, like the other 503s: every policy check denies until the store answers,
    # and a change or a privacy-center page refused meanwhile is retried, not a fault
    # (review of 0173, bug MF; it fell through to 500 "internal").
    (PolicyStoreError, 503, "policy_store_unavailable"),
    # The database itself did not answer (``store_outage``): temporary too, and a
    # privacy-center sign-in refused for it keeps its link (bug NH; it was 500).
    (StoreUnavailableError, 503, "store_unavailable"),
    # A residue scan from the console beside a rebuild that outlasts ``schema_lock_wait_s``
    # (0240-readers-beside-a-rebuild): the views are being replayed, ask again later.
    (SchemaLockWaitError, 503, "store_unavailable"),
    (StoredDataDamagedError, 500, "stored_data_damaged"),
    (UprofError, 500, "internal"),
)


#: Seconds a client is told to wait (Retry-After) before retrying a refused capture.
CAPTURE_RETRY_AFTER_S = 1
#: Seconds a client is told to wait when the rate-limit counters did not answer.
RATE_LIMIT_UNAVAILABLE_RETRY_AFTER_S = 5
#: Seconds a client is told to wait when the first request with its key still runs.
REQUEST_IN_PROGRESS_RETRY_AFTER_S = 5
#: Seconds a client is told to wait when the policy store could not be read.
POLICY_STORE_RETRY_AFTER_S = 5
#: Seconds a client is told to wait when the database did not answer.
STORE_UNAVAILABLE_RETRY_AFTER_S = 5

#: Driver errors that say the database did not answer (connections refused or ended, the
#: pool's wait for one run out, a store that cannot be read), through SQLAlchemy or
#: eventsourcing's own recorders: an outage, not a fault of the request or of uprof. A
#: constraint or a malformed statement (``IntegrityError``, ``ProgrammingError``) stays a
#: fault (500).
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    sqlite3.OperationalError,  # uprof's own SQLite connections (the journal's switch)
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.TimeoutError,
    es_persistence.OperationalError,
    es_persistence.InterfaceError,
)


def classify(error: UprofError) -> tuple[int, str]:
    """Return (HTTP status, error code) for a uprof error."""
    return next((status, code) for cls, status, code in STATUS_TABLE if isinstance(error, cls))


def retry_after_s(error: UprofError) -> int | None:
    """The ``Retry-After`` (seconds) a refusal for ``error`` carries, or None: one table for
    REST, MCP and the web pages."""
    waits: tuple[tuple[type[UprofError], int], ...] = (
        (CaptureBackloggedError, CAPTURE_RETRY_AFTER_S),
        (RateLimitUnavailableError, RATE_LIMIT_UNAVAILABLE_RETRY_AFTER_S),
        (RequestInProgressError, REQUEST_IN_PROGRESS_RETRY_AFTER_S),
        (PolicyStoreError, POLICY_STORE_RETRY_AFTER_S),
        (StoreUnavailableError, STORE_UNAVAILABLE_RETRY_AFTER_S),
        (SchemaLockWaitError, STORE_UNAVAILABLE_RETRY_AFTER_S),
    )
    return next((wait for cls, wait in waits if isinstance(error, cls)), None)


def store_outage(error: BaseException) -> StoreUnavailableError | None:
    """The refusal to answer for ``error`` when it is the database not answering (one of
    ``OUTAGE_ERRORS``), else None. Its message names the driver's error class only: the
    driver's text may quote a statement's parameters."""
    if not isinstance(error, OUTAGE_ERRORS):
        return None
    cause = getattr(error, "orig", None) or error.__cause__ or error
    if isinstance(cause, sqlite3.Error) and not sqlite_did_not_answer(cause):
        # SQLite's driver raises OperationalError for a statement that cannot run too,
        # where PostgreSQL's raises ProgrammingError: a fault on both (bug NR).
        return None
    return StoreUnavailableError(f"the database did not answer ({type(cause).__name__})")


#: Every driver error a store's trouble can surface as: the outages, and the damage
#: ``store_damage`` reads (SQLite's ``DatabaseError`` for a file that is not a database,
#: a ``ProgrammingError`` for a table of the wrong shape). What ``store_refusal`` does not
#: name stays a fault (500 ``internal``).
STORE_ERRORS: tuple[type[Exception], ...] = (
    *OUTAGE_ERRORS,
    sqlite3.DatabaseError,
    sa.exc.DatabaseError,
    es_persistence.DatabaseError,
)


def store_refusal(error: BaseException) -> UprofError | None:
    """The refusal for a driver's ``error`` when it is the stores' trouble, not a fault:
    the database not answering (``store_outage``, 503) or stored data damaged
    (``store_damage``, 500 ``stored_data_damaged``); else None. The one rule of the CLI,
    REST, MCP and the embedded SDK (0214-store-damage-in-servers, bug SG: the servers
    asked the outage only)."""
    return store_outage(error) or store_damage(error)


def log_store_trouble(refusal: UprofError) -> None:
    """Log a server's ``store_refusal``: an outage as a warning, each time (it ends by
    itself); damage once, with what the operator must do (``log_store_damage``)."""
    if isinstance(refusal, StoredDataDamagedError):
        log_store_damage(refusal)
    else:
        _log.warning("database did not answer: %s", refusal)


def internal_body() -> ErrorOut:
    """The answer to a fault (no refusal, no outage): 500 ``internal`` on REST, the same
    body as an MCP tool's error. Generic: a fault's text may quote stored data, so it
    stays in the server's log."""
    return ErrorOut(error=ErrorBody(code="internal", message="internal server error"))


def body_for(error: UprofError) -> ErrorOut:
    """The response body for a uprof error: what happened and what to do about it."""
    _, code = classify(error)
    field = getattr(error, "field", None)
    fields = [FieldProblem(field=field, message=str(error))] if field else []
    return ErrorOut(error=ErrorBody(code=code, message=str(error), hint=error.hint, fields=fields))


@dataclass
class EdgeError(Exception):
    """A refusal decided at the service edge (authentication, roles, limits)."""

    status: int
    code: str
    message: str
    hint: str = ""
    fields: list[FieldProblem] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message

    def body(self) -> ErrorOut:
        return ErrorOut(
            error=ErrorBody(
                code=self.code, message=self.message, hint=self.hint, fields=self.fields
            )
        )


def unauthenticated(message: str = "missing or invalid API key") -> EdgeError:
    return EdgeError(
        401,
        "unauthenticated",
        message,
        hint="send 'Authorization: Bearer <key>' with a key from `uprof apps create`",
    )


def role_required(role: str) -> EdgeError:
    return EdgeError(
        403,
        "role_required",
        f"this API key lacks the {role!r} role",
        hint=f"ask the operator for a key created with --role {role}",
    )


def payload_too_large(limit_bytes: int) -> EdgeError:
    return EdgeError(
        413,
        "payload_too_large",
        f"request body exceeds {limit_bytes} bytes",
        hint="split the batch into smaller requests",
    )


def validation_problem(problems: list[FieldProblem]) -> EdgeError:
    """A 422 that names each offending field."""
    summary = "; ".join(f"{p.field}: {p.message}" for p in problems[:5]) or "invalid request"
    return EdgeError(
        422,
        "invalid_request",
        summary,
        hint="fix the named fields; nothing was stored",
        fields=problems,
    )
