"""One error root for uprof, mapped to exit codes / HTTP statuses only at the edges.

UprofError
├── InvalidInputError        bad input from a caller; nothing was written
│   └── ItemNotFoundError    the subject's profile holds no item with that id
├── ConsentRequiredError     no consent in force for (subject, app, category, purpose)
├── EvidenceError            a proposal cites evidence that is missing or belongs elsewhere
├── PermissionDeniedError    a policy or visibility rule refused the request
├── IdentityError            the subject could not be resolved, or resolved ambiguously
│   └── AmbiguousIdentityError   the request's names (subject, session, identifier) disagree
├── SubjectNotFoundError     no such data subject
│   ├── ConsentNotFoundError  the subject holds no consent with that id for the app
│   └── IntentNotFoundError   no active intent by that id or description the agent may see
├── SubjectErasedError       the subject was erased; its stream refuses reads and writes
├── IntentTransitionError    an intent lifecycle change that the lifecycle forbids
├── ReadTimeoutError         projections did not catch up within the wait bound
├── ErasureIncompleteError   keys are destroyed but derived stores are not purged yet
├── ModelUnavailableError    the configured embedding model is not installed on this machine
├── EmbedderMismatchError    the store's vectors were made by another embedding model
├── RateLimitUnavailableError the rate-limit counters could not be read: refused, not let through
├── StoreUnavailableError    the database did not answer (an outage): refused, retried later
├── DeploymentNotFoundError  no deployment where a command that reads one was sent
│   └── DatabaseNotFoundError  the PostgreSQL server has no database of the URL's name
└── ConcurrencyConflictError other writers kept winning the race (retries gave up)
    ├── VersionConflictError another writer saved the same stream version or log index first
    ├── StoreBusyError       another connection held the store's lock past the driver's wait
    ├── RequestInProgressError  a request came again while its first still runs
    │   └── SignInLinkInUseError  a sign-in link pressed while another sign-in holds it
    └── PositionMovedError   another worker saved past a batch's starting position

The subclasses of ConcurrencyConflictError are transient: nothing was written, and the
same attempt may succeed a moment later. The stores raise the version, busy and position
ones, translating their drivers' errors by type and error code (never by message text),
and ``uprof/retry.py`` decides which are tried again, how often and after what wait. What
escapes the retries is still a ConcurrencyConflictError, which every edge maps to "retry
later" (409). ``RequestInProgressError`` is raised where a first request still runs and
will decide (a keyed withdrawal, a sign-in link): 409 with ``Retry-After``.
"""

from __future__ import annotations


class UprofError(Exception):
    """Base of every error uprof raises on purpose."""

    #: Short hint for the caller: what they can do about it.
    hint: str = ""

    def diagnostics(self) -> str:
        """Say what happened and what the caller can do."""
        message = str(self)
        return f"{message}\n  hint: {self.hint}" if self.hint else message


class InvalidInputError(UprofError):
    """Bad input. ``field`` names the offending field when one is to blame: the hint says
    which, and the REST body lists it in ``error.fields``."""

    hint = "correct what the message names and send the request again; nothing was stored"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        if field is not None:
            self.hint = f"fix {field} and send the request again; nothing was stored"


class ItemNotFoundError(InvalidInputError):
    """No item with the given id in the subject's profile (never held, or erased)."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"no item {item_id!r} in this subject's profile", field="item_id")
        self.item_id = item_id


class ConsentRequiredError(UprofError):
    hint = "ask the user to grant consent for this app, category and purpose"


class EvidenceError(UprofError):
    hint = "cite events captured for this same subject (see `uprof evidence`)"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        #: Where the refused evidence is cited (``proposals.<i>.evidence``), if known.
        self.field = field


class PermissionDeniedError(UprofError):
    hint = "the policy in policies/ decides who may read what; ask the operator"


class IdentityError(UprofError):
    """``field`` names the name of the request that did not resolve (``session_id``,
    ``identifier``), when one is to blame: the REST body lists it in ``error.fields``."""

    hint = "name the subject explicitly on the request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        if field is not None:
            self.hint = "leave it out, or register it for the subject first; nothing was read"


class AmbiguousIdentityError(IdentityError):
    """The subject, session and identifier a request names resolve to different subjects."""


class SubjectNotFoundError(UprofError):
    hint = (
        "check the subject reference; a subject exists once a consent was granted for it "
        "(`uprof consent grant`, POST /v1/consents)"
    )


class ConsentNotFoundError(SubjectNotFoundError):
    """No consent with the given id for the subject and app. A ``SubjectNotFoundError``
    (exit 5, 404) as before, but its own hint: the subject's told an operator to check
    the subject reference, which was right (bug RY)."""

    hint = (
        "list the subject's consents (`uprof consent list --subject S`, POST "
        "/v1/consents/list) and name one of them; nothing was changed"
    )


class IntentNotFoundError(SubjectNotFoundError):
    """An intent update names no active intent (by id or description) that the proposing
    agent may see. A ``SubjectNotFoundError`` (exit 5, 404) as before, an intent another
    agent keeps private answered alike, but its own code and hint: the subject's hint told
    the app to check the subject reference, and it was right (0209's Left)."""

    hint = (
        "read the subject's profile slice for its active intents and name one by its id "
        "(or its description); nothing was written"
    )


class SubjectErasedError(UprofError):
    hint = (
        "this subject was erased; an operator may re-create the id as a new, "
        "unlinked subject (`uprof subjects recreate`)"
    )


class IntentTransitionError(UprofError):
    hint = "only active intents can be fulfilled, abandoned or expired"


class ReadTimeoutError(UprofError):
    hint = "projections are behind; retry or raise the wait bound"


class ErasureIncompleteError(UprofError):
    hint = "the tombstone and key destruction are recorded; retry to finish and get the receipt"


class ErasureRolledBackError(UprofError):
    hint = (
        "a restore removed this erasure's tombstone from the log; its keys stay destroyed "
        "and its rows purged, but no receipt can cite the tombstone (docs/governance.md)"
    )


class ModelUnavailableError(UprofError):
    hint = "run `uprof models fetch <embedder>` once on this machine (make setup does)"


class EmbedderMismatchError(UprofError):
    hint = (
        "set UPROF_EMBEDDER back to the recorded model, or stop every server and worker and"
        " run `uprof projections rebuild` with the new one (decision 0049)"
    )


class RateLimitUnavailableError(UprofError):
    """The deployment's rate-limit counters did not answer (the database is down or busy
    past its wait): the request is refused rather than let through uncounted."""

    hint = "retry after a few seconds (header Retry-After); nothing was done"


class StoreUnavailableError(UprofError):
    """The database did not answer a request (refused or lost connections, a store that
    cannot be read): an outage, temporary like the other 503s. Raised at the edge only,
    from the driver's error (``uprof.api.errors.store_outage``); the request stopped
    where the database failed it."""

    hint = "retry after a few seconds (header Retry-After): the database did not answer"


class CheckUnansweredError(StoreUnavailableError):
    """A check asked under a write lock every writer waits for (is the request's key
    still standing?) did not answer within its bound (``domain.under_lock``): the store it
    reads is hung or overloaded. Nothing was written and the lock was let go."""


class StoresLostError(UprofError):
    """This process lost its hold on the stores (the PostgreSQL session holding them open
    ended) and a restore holds them or replaced them since: what it read may be gone."""

    hint = "restart this process: it refuses every request until then"


class ConcurrencyConflictError(UprofError):
    hint = "other writers changed this subject at the same time; retry the request"


class VersionConflictError(ConcurrencyConflictError):
    """Another writer saved first: the stream version (or audit leaf index) this write
    claimed is taken. Nothing was written; reload and decide again."""


class StoreBusyError(ConcurrencyConflictError):
    """Another connection held the store's lock for longer than the driver waits
    (SQLite BUSY or LOCKED; PostgreSQL lock timeout, serialization failure, deadlock).
    Nothing was written."""

    hint = "the store is busy with other writers; retry after a short wait"


class RequestInProgressError(ConcurrencyConflictError):
    """A keyed request came again while its first is still running (an erasing
    withdrawal, which must not run twice at once); nothing was written. ``field`` names
    the key as the caller sent it."""

    hint = (
        "the first request with this Idempotency-Key is still running; retry the same "
        "request with the same key after a short wait (header Retry-After)"
    )

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SignInLinkInUseError(RequestInProgressError):
    """A privacy-center sign-in link was posted while another sign-in with it has taken
    it and not finished yet (between ``LinkStore.redeem`` and its session, its refusal or,
    stopped by an outage, its give-back). The link is not spent and this press changed
    nothing: the other sign-in decides it, so "retry", never "Link not valid" (bug NW)."""

    hint = (
        "another sign-in with this link has not finished yet; retry after a short wait "
        "(header Retry-After)"
    )


class PositionMovedError(ConcurrencyConflictError):
    """Another worker saved past the position a batch started from; nothing was written.

    Raised by the guarded tracking save (uprof/recorders.py) and the projection's
    position update; the runner that gets it re-reads the position and the log.
    """

    hint = "another worker processed this range first; re-read the position"

    def __init__(self, name: str, expected: int, new: int) -> None:
        super().__init__(
            f"position {name!r} is no longer {expected} (the batch up to {new} rolled back)"
        )
        self.name = name
        self.expected = expected
        self.new = new


class DeploymentNotFoundError(UprofError):
    """A command that reads or changes a deployment was sent where none is: a data folder
    holding no uprof stores (a typo'd ``--data-dir``, another working directory, no
    ``UPROF_DATA_DIR``), a database without uprof's tables. Raised before anything is
    made there: answering about a new, empty deployment made on the spot would tell a
    check that cannot fail as a pass (decision 0237-the-wrong-folder)."""

    hint = (
        "name the deployment's data folder (--data-dir, UPROF_DATA_DIR) or database "
        "(--database-url, UPROF_DATABASE_URL); to make a new deployment there, run "
        "`uprof init` (or start it with `uprof serve` or `uprof apps create`)"
    )


class DatabaseNotFoundError(DeploymentNotFoundError):
    """The PostgreSQL server of ``--database-url`` answered that it has no database of
    that name (a typo'd name, one not created yet). Not an outage: waiting changes
    nothing, and uprof makes tables, never databases (decision
    0242-the-wrong-folder-2, bug XC)."""

    hint = (
        "correct the database's name in --database-url (UPROF_DATABASE_URL), or create "
        "it on the server (createdb NAME, or CREATE DATABASE) and run `uprof init`"
    )


class BackupFolderNamedError(DeploymentNotFoundError):
    """The data folder named holds a uprof backup (``uprof backup --to``: the stores'
    files and a signed manifest of their checksums), not a deployment. Opened as one, the
    start rewrote the copies and a reader's audit entry went in: the backup no longer
    matched its manifest, and ``uprof restore`` refused it (bug XK)."""

    hint = (
        "name the deployment's data folder (--data-dir, UPROF_DATA_DIR); to bring the "
        "backup back, run `uprof restore --from FOLDER` with the deployment's data folder"
    )


class StoresUnwritableError(UprofError):
    """The deployment's stores cannot be written: a SQLite data folder, or its store
    files, that this process may not write (immutable, a read-only mount, another user's
    mode), a PostgreSQL database that takes no writes (a standby, or one set
    ``default_transaction_read_only``). Refused at the start, naming the place and what is
    wrong with it: SQLite's "unable to open database file" was told as the outage ("the
    database did not answer ... retry"), which waiting does not mend, and PostgreSQL's
    read-only transaction ended in a traceback (bug XQ)."""

    hint = (
        "make the data folder and its store files writable by the user that runs uprof "
        "(chattr -i, chmod u+w, chown, a read-write mount), or name a database that takes "
        "writes (the primary, not a standby; default_transaction_read_only off); nothing "
        "was changed"
    )


class KeyFolderUnwritableError(StoresUnwritableError):
    """The key folder cannot be made (the folder above it cannot be written), or, on
    SQLite, its key store (``keys.sqlite``, or the folder SQLite makes its journal in)
    cannot be written by this process. The key store was told as the outage ("retry"),
    and a key folder that could not be made ended in a traceback (bug XY)."""

    hint = (
        "make the key folder and its key store writable by the user that runs uprof "
        "(chattr -i, chmod u+w, chown, a read-write mount), or name a key folder that can "
        "be (--key-dir, UPROF_KEY_DIR); nothing was changed"
    )


class AnotherProgramsStoreError(DeploymentNotFoundError):
    """A SQLite data folder that holds no deployment, but a store file of uprof's name
    (``events.sqlite``, ...) holding another program's tables. A start that makes a
    deployment wrote uprof's tables into that program's database (bug XU, after XO)."""

    hint = (
        "name another data folder (--data-dir, UPROF_DATA_DIR) for uprof's deployment; "
        "the file found there is another program's and was not changed"
    )


class StoreOfANewerReleaseError(UprofError):
    """A store records a schema revision this release's migrations do not have: a newer
    uprof migrated it (an older CLI run on it, a release rolled back). Refused at the
    start, naming the store and the revision, nothing changed: its migration ended in
    alembic's traceback (bug XP)."""

    hint = (
        "run the uprof release that upgraded this deployment (or a newer one); nothing was changed"
    )


class StoredDataDamagedError(UprofError):
    """A stored event failed authentication: the storage was damaged or altered. Raised
    instead of serving anything from it; the message names the event's version only."""

    hint = (
        "a stored event of this subject cannot be opened (damaged or altered storage); "
        "restore the stores from a backup, or erase the subject"
    )
    #: What the operator's log line names beside the message (a missing column of uprof's
    #: own schema, 0216-review-of-0211-to-0214's TE; a damaged file's driver text, escaped
    #: to one line, 0219-review-of-0216-and-tf's TZ); never put in an answer.
    detail = ""


class StoreFileDamagedError(StoredDataDamagedError):
    """A SQLite store's file is not a database, or its pages are damaged (SQLite's
    ``SQLITE_NOTADB``, ``SQLITE_CORRUPT``): replaced, truncated, or copied over. A command
    ended in the driver's traceback (review of 0199 and 0201, bug QH)."""

    hint = (
        "a *.sqlite file of the data folder was replaced or damaged (check each with "
        "`sqlite3 FILE 'PRAGMA integrity_check'`); restore the stores from a backup "
        "(uprof restore); nothing was changed"
    )


class StoreShapeDamagedError(StoredDataDamagedError):
    """A table of the stores lacks a column uprof made (SQLite's ``no such column``,
    PostgreSQL's ``UndefinedColumn``): altered by hand, or made again by hand. A running
    server answered 500 ``internal`` with a traceback (0214-store-damage-in-servers, bug
    SH); or, on SQLite, where the event log's library writes rows by position, an event
    store table with a column more (0224-review-of-0220-and-0223, bug UP)."""

    hint = (
        "a table of the stores was altered by hand (a column uprof made is missing, or, "
        "on SQLite, a column was added to an event store table); restore the stores "
        "from a backup (uprof restore); nothing was changed"
    )


class ReadRecordingError(UprofError):
    hint = "reads cannot be recorded right now, so none are served; check the store and retry"


class CaptureBackloggedError(UprofError):
    """The capture writer's queue stayed full: the capture was refused, nothing stored."""

    hint = "the server is writing captures as fast as it can; retry after a short wait"


class IdempotencyKeyReusedError(UprofError):
    """The same idempotency key came back with a different request. ``field`` names the
    key as the caller sent it (the REST body lists it in ``error.fields``)."""

    hint = (
        "an Idempotency-Key names one request: send the identical body to replay it, "
        "or a new key for a new request"
    )

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
