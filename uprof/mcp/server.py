"""The uprof MCP server: tools ``profile_slice``, ``capture``, ``forget`` and a profile resource.

Every tool calls ``AppScope`` (``uprof.api.scoped``), exactly what the REST routes
call, so the same consent gate, policy and visibility rules apply. The calling app
comes from authentication, as over REST (I3):

- stdio: the API key in ``UPROF_API_KEY``, checked when the server starts (the
  process serves one app; ``build_server(stdio_principal=...)``) and again before every
  call through ``stdio_check`` (``uprof mcp`` passes the key store's ``authenticate``):
  a key revoked meanwhile, by any process, is refused within ``KEY_CACHE_TTL_S``, as
  over REST;
- streamable HTTP: ``Authorization: Bearer <key>`` on every request, checked by the
  SDK's bearer middleware through ``ApiKeyTokenVerifier``; a missing, invalid or
  revoked key gets 401 before any tool runs.

The REST API's limits hold here too: ``http_app`` refuses a body over the size limit
(413) before it is read, and a key's ``initialize`` once the key holds
``max_sessions_per_key`` open sessions (429 ``too_many_sessions``: the SDK's session limit
is the whole server's, every app's and tenant's), and ``rate_limit`` (``UPROF_RATE_LIMIT``)
counts against the key's allowance every HTTP request bearing a valid key, whatever it
asks (``initialize``, ``ping``, ``tools/list``, notifications included: REST counts every
authenticated request), refusing it over the limit with 429 ``rate_limited`` before the SDK
reads it; over stdio every tool call and resource read (a ``rate_limited`` tool error,
nothing done).

Failures become tool errors (``is_error``) whose text is the REST error body as JSON
(``{"error": {"code": "consent_required", "message": ..., "hint": ..., "fields": [...]}}``),
bad arguments included (an argument a tool does not declare too, as REST refuses an unknown
field), never a traceback or raw validation text; a refused read of the profile resource is
a protocol error whose message is that body, and is not logged (its URI names the subject).
The database not answering is REST's 503 ``store_unavailable`` body (``store_outage``), and
over HTTP a key check it stopped is answered 503 with ``Retry-After`` (bug OK).
Arguments have the REST defaults: what REST requires (``occurred_at``, ``purpose``,
``budget_tokens``) is required.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any, ClassVar, TypeVar

import anyio.to_thread
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.types import INTERNAL_ERROR, ToolAnnotations
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from domain.errors import RateLimitUnavailableError, UprofError
from uprof.api.deps import key_still_live
from uprof.api.errors import (
    RATE_LIMIT_UNAVAILABLE_RETRY_AFTER_S,
    STORE_ERRORS,
    EdgeError,
    body_for,
    classify,
    internal_body,
    log_store_trouble,
    retry_after_s,
    store_refusal,
    unauthenticated,
    validation_problem,
)
from uprof.api.limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimitMiddleware
from uprof.api.ratelimit import KeyRateLimiter, RateLimitedError, limiter_for
from uprof.api.runtime import ServiceRuntime
from uprof.api.scoped import AppScope
from uprof.apikeys.store import ApiKeyStore, NeedsRead, Principal
from uprof.mcp.stdio import bounded_stdio_server
from uprof.schemas import api as w
from uprof.schemas.api import ErrorOut, FieldProblem, field_problems

T = TypeVar("T")

_log = logging.getLogger(__name__)

_ARGUMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

INSTRUCTIONS = (
    "uprof keeps a governed profile of each user. Call profile_slice before answering to get "
    "what you may know about the user for your purpose, within a token budget; call capture "
    "to record what the user said; call forget when the user withdraws consent or asks to be "
    "forgotten. Subjects are the user references your app uses."
)


class ApiKeyTokenVerifier:
    """Check bearer tokens against the API-key store (the MCP SDK's TokenVerifier protocol)."""

    def __init__(self, api_keys: ApiKeyStore) -> None:
        self._api_keys = api_keys

    async def verify_token(self, token: str) -> AccessToken | None:
        # The store is synchronous (SQLAlchemy); keep the event loop free.
        principal = await anyio.to_thread.run_sync(self._api_keys.authenticate, token)
        if principal is None:
            return None
        return AccessToken(
            token=token,
            client_id=principal.app_id,
            scopes=sorted(principal.roles),
            subject=principal.key_id,
        )


class ForgetResult(BaseModel):
    """What ``forget`` did: consents withdrawn and erasure receipts."""

    withdrawn: list[w.Consent] = Field(default_factory=list)
    erasures: list[w.ErasureReceipt] = Field(default_factory=list)


class ToolSliceIn(w.SliceIn):
    """The slice as ``profile_slice`` asks for it: by subject or session, no identifier
    (its refusals name only the tool's arguments)."""

    _subject_names: ClassVar[tuple[str, ...]] = ("subject", "session_id")


class UprofToolCrash(UnexpectedToolError):
    """A fault under a tool: still a crash to the SDK (it logs the traceback of its
    cause), its text REST's 500 body, ``internal``, so an agent parsing every tool error
    as the REST body can branch on the code (review of 0186 and 0188's Left)."""

    def __init__(self) -> None:
        super().__init__(internal_body().model_dump_json())


class UprofToolError(ToolError):
    """A tool failure whose text is the REST error body, as JSON."""

    def __init__(self, body: ErrorOut) -> None:
        super().__init__(body.model_dump_json())


#: The REST header, named as the tools take it: an MCP caller sent the argument, and an
#: error naming a header it never sent does not tell it what to fix (bug IL).
_ARGUMENT_OF_HEADER = {"Idempotency-Key": "idempotency_key"}


def _error_body(error: UprofError | EdgeError | ValidationError) -> ErrorOut:
    if isinstance(error, ValidationError):
        return validation_problem(field_problems([dict(e) for e in error.errors()])).body()
    if isinstance(error, EdgeError):
        return error.body()
    return _in_tool_terms(body_for(error))


def _in_tool_terms(body: ErrorOut) -> ErrorOut:
    """The body with each REST header it names called by the tool argument it came from."""
    named = body.error
    if not any(f.field in _ARGUMENT_OF_HEADER for f in named.fields):
        return body

    def said(text: str) -> str:
        for header, argument in _ARGUMENT_OF_HEADER.items():
            text = text.replace(header, argument)
        return text

    fields = [
        f.model_copy(
            update={"field": _ARGUMENT_OF_HEADER.get(f.field, f.field), "message": said(f.message)}
        )
        for f in named.fields
    ]
    error = named.model_copy(
        update={"message": said(named.message), "hint": said(named.hint), "fields": fields}
    )
    return body.model_copy(update={"error": error})


def _tool_error(error: UprofError | EdgeError | ValidationError) -> UprofToolError:
    return UprofToolError(_error_body(error))


@contextlib.contextmanager
def _as_tool_errors() -> Iterator[None]:
    """Raise every refusal of the block as the tool error carrying its REST body, the
    database not answering included: 503 ``store_unavailable``'s body (``store_outage``).
    The driver's error escaped the tool, which the SDK answers as a crash ("Error
    executing tool <name>", nothing an agent can act on) and logs with its traceback
    (bug OK). Any other driver error is a fault and stays a crash."""
    try:
        yield
    except (UprofError, EdgeError, ValidationError) as error:
        raise _tool_error(error) from None
    except STORE_ERRORS as error:
        answer = store_refusal(error)  # damage too (0214-store-damage-in-servers, SG)
        if answer is None:
            raise
        log_store_trouble(answer)
        raise _tool_error(answer) from None


class UprofMCPServer(MCPServer):
    """The SDK's server, with every failure in the REST error form.

    ``api_keys`` is the key store its HTTP transport authenticates with (None: stdio).
    ``count_call`` (set by ``build_server`` when a rate limit is set) counts one request of
    the calling key, raising the ``rate_limited`` (or ``unauthenticated``) tool error.

    The SDK validates arguments against the tool's signature before the tool runs and
    reports a mismatch as ``Error executing tool <name>: <pydantic text>``; here that,
    and the SDK's prefix on the tools' own errors, become the REST body.
    """

    api_keys: ApiKeyStore | None = None
    count_call: Callable[[], None] | None = None
    #: The key's allowance (``rate_limit``), counted at the HTTP edge by ``http_app``.
    limiter: KeyRateLimiter | None = None
    #: The largest message read over stdio: the HTTP transport's body limit
    #: (``--max-body-bytes``), which stdio lacked (decision 0173's Left).
    max_stdio_message_bytes: int = DEFAULT_MAX_BODY_BYTES

    async def run_stdio_async(self) -> None:
        """The SDK's stdio serving, with the message size limit
        (``uprof.mcp.stdio.bounded_stdio_server``)."""
        server = self._lowlevel_server
        async with bounded_stdio_server(self.max_stdio_message_bytes) as (read, write):
            await server.run(read, write, server.create_initialization_options())

    async def _counted(self) -> None:
        # Every tool call and resource read is one request of the key, counted before its
        # arguments are looked at: a call refused for them is counted as REST counts a 422
        # (review of 0117: an agent looping on malformed calls was never slowed over MCP).
        # In a worker thread: the count is a database transaction (0115) that may wait.
        if self.count_call is not None:
            await anyio.to_thread.run_sync(self.count_call)

    async def read_resource(self, uri: Any, context: Any = None) -> Any:
        try:
            await self._counted()
        except UprofToolError as refused:
            raise _resource_error(refused) from None
        return await super().read_resource(uri, context)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        await self._counted()
        # The SDK drops arguments the tool does not declare; REST refuses an unknown body
        # field. An argument naming another app, a role or a principal must not be taken
        # for granted by the caller while the call runs as the key's app: refuse it.
        schema = self._tool_input_schema(name)
        if schema is not None:
            unknown = sorted(set(arguments) - set(schema.get("properties", {})))
            if unknown:
                # Named only when it looks like a name: the SDK logs the error's text.
                problems = [
                    FieldProblem(
                        field=f if _ARGUMENT_NAME.fullmatch(f) else "(argument)",
                        message="this tool takes no such argument",
                    )
                    for f in unknown
                ]
                raise UprofToolError(validation_problem(problems).body())
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as crash:
            raise UprofToolCrash() from crash
        except ToolError as error:
            cause = error.__cause__
            if isinstance(cause, UprofToolError):
                raise cause from None
            if isinstance(cause, ValidationError):
                # Chained, so the SDK logs the rejected field names, never their values.
                raise _tool_error(cause) from cause
            raise


def build_server(
    runtime: ServiceRuntime,
    api_keys: ApiKeyStore | None = None,
    *,
    stdio_principal: Principal | None = None,
    stdio_check: Callable[[], Principal | None] | None = None,
    issuer_url: str = "http://127.0.0.1:8766",
    rate_limit: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> MCPServer:
    """Build the MCP server over a runtime.

    Give ``stdio_principal`` for stdio (one app per process), ``api_keys`` for
    streamable HTTP (a key per request). ``stdio_check``, with ``stdio_principal``:
    asked before every call, it checks the key again and returns its principal, or
    None once the key is no longer valid (the call is then refused). ``issuer_url``
    only fills the SDK's auth settings; uprof issues keys itself (``uprof apps
    create``), not through OAuth. ``rate_limit``: requests per API key, in the notation
    of ``UPROF_RATE_LIMIT`` (each tool call and resource read is one request).
    ``max_message_bytes``: the largest message read over stdio (HTTP's is ``http_app``'s
    ``max_body_bytes``; ``uprof mcp --max-body-bytes`` sets both).
    """
    limiter = limiter_for(runtime.kernel, rate_limit)
    verifier = ApiKeyTokenVerifier(api_keys) if api_keys is not None else None
    auth = (
        AuthSettings(issuer_url=issuer_url, resource_server_url=None, validate_token_resource=False)
        if verifier is not None
        else None
    )
    server = UprofMCPServer(
        "uprof",
        instructions=INSTRUCTIONS,
        token_verifier=verifier,
        auth=auth,
        log_level="WARNING",
    )
    server.api_keys = api_keys
    server.limiter = limiter
    server.max_stdio_message_bytes = max_message_bytes

    def count_call() -> None:
        """Count one request of the calling key against its allowance (after
        authentication, as REST: a caller without a valid key is refused uncounted).

        Over streamable HTTP every request was counted already, whatever it asks, by
        ``http_app``'s ``KeyCountedMiddleware``: nothing more here."""
        assert limiter is not None
        if get_access_token() is not None:
            return
        with _as_tool_errors():  # over the limit, not countable, or the key not read
            limiter.check(authenticated_stdio().key_id)

    if limiter is not None:
        server.count_call = count_call

    def authenticated_stdio() -> Principal:
        if stdio_principal is None:
            # Neither transport authenticated the caller: fail closed.
            raise _tool_error(
                unauthenticated("no API key: set UPROF_API_KEY or send a bearer token")
            )
        principal = stdio_principal if stdio_check is None else stdio_check()
        if principal is None or principal.key_id != stdio_principal.key_id:
            raise _tool_error(unauthenticated("UPROF_API_KEY is no longer valid (revoked)"))
        return principal

    def scope() -> AppScope:
        # Counted already, by ``UprofMCPServer`` before the call's arguments were checked.
        token = get_access_token()
        if token is not None:
            return AppScope(
                runtime,
                token.client_id,
                frozenset(token.scopes),
                key_id=token.subject or "",
                still_authenticated=None
                if api_keys is None
                else key_still_live(api_keys, token.subject or ""),
            )
        principal = authenticated_stdio()
        return AppScope(
            runtime,
            principal.app_id,
            principal.roles,
            key_id=principal.key_id,
            still_authenticated=None if stdio_check is None else stdio_still_live(),
        )

    def stdio_still_live() -> Callable[[], None]:
        def check() -> None:
            principal = None if stdio_check is None else stdio_check()
            if (
                principal is None
                or stdio_principal is None
                or principal.key_id != stdio_principal.key_id
            ):
                raise unauthenticated("UPROF_API_KEY was revoked while the call waited")

        return check

    def call(operation: Callable[[AppScope], T]) -> T:
        with _as_tool_errors():  # the key's check reads the database too
            return operation(scope())

    # A slice is recorded (audit entry, read receipt for the user) but changes nothing the
    # agent could observe: read-only for the agent, and the same call gives the same answer.
    @server.tool(
        annotations=ToolAnnotations(
            title="Profile slice",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        )
    )
    def profile_slice(
        query: Annotated[str, Field(description="What the agent is about to answer.")],
        agent_id: Annotated[str, Field(description="The calling agent's id.")],
        purpose: Annotated[
            str,
            Field(
                description="Why the profile is read, e.g. personalization; policy and consent "
                "are decided per purpose."
            ),
        ],
        budget_tokens: Annotated[
            int,
            Field(
                ge=0,
                le=w.MAX_BUDGET_TOKENS,
                description="Most tokens (cl100k) the returned text may take.",
            ),
        ],
        subject: Annotated[str | None, Field(description="The user reference.")] = None,
        session_id: Annotated[
            str | None, Field(description="A session registered by this app.")
        ] = None,
        agent_type: Annotated[
            str,
            Field(
                description="The calling agent's type, for items shared with agent types "
                "(shared:<types>)."
            ),
        ] = "",
    ) -> w.ProfileSlice:
        """Get the part of the user's profile this app may use for the query, within a token budget.

        The result's `text` is ready to put in the prompt; `withheld` counts items the
        policy, the user's consent or the sharing rules kept out.
        """
        return call(
            lambda s: s.slice(
                ToolSliceIn(
                    subject=subject,
                    session_id=session_id,
                    query=query,
                    budget_tokens=budget_tokens,
                    purpose=purpose,
                    agent_id=agent_id,
                    agent_type=agent_type,
                )
            )
        )

    @server.tool(
        annotations=ToolAnnotations(
            title="Capture an interaction",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        )
    )
    def capture(
        subject: Annotated[str, Field(description="The user reference.")],
        agent_id: Annotated[str, Field(description="The calling agent's id.")],
        user_input: Annotated[str, Field(description="What the user said.")],
        occurred_at: Annotated[
            str,
            Field(
                description="When it happened, ISO 8601 with a zone, e.g. 2026-12-01T09:30:00Z "
                "(required, as over REST: a default of now would differ between retries)."
            ),
        ],
        agent_response: Annotated[str, Field(description="What the agent answered.")] = "",
        session_id: Annotated[str, Field(description="This app's session id, if any.")] = "",
        source_ref: Annotated[
            str, Field(description="Your own reference to the interaction, kept verbatim.")
        ] = "",
        purpose: Annotated[
            str,
            Field(
                description="The purpose it is collected for (the user's consent must cover it)."
            ),
        ] = "personalization",
        sharing: Annotated[
            str, Field(description="private | shared | shared:<agent types>")
        ] = "private",
        idempotency_key: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=255,
                pattern=r"^[\x21-\x7e]+$",
                description=(
                    "Makes the call safe to retry: a retry with the same key and arguments "
                    "gets the first answer and records nothing again."
                ),
            ),
        ] = None,
    ) -> w.CaptureAck:
        """Record one interaction with the user (refused without the user's consent)."""
        return call(
            lambda s: s.capture(
                w.CaptureIn.model_validate(
                    {
                        "subject": subject,
                        "agent_id": agent_id,
                        "user_input": user_input,
                        "agent_response": agent_response,
                        "session_id": session_id,
                        "source_ref": source_ref,
                        "purpose": purpose,
                        "sharing": sharing,
                        "occurred_at": occurred_at,
                    }
                ),
                idempotency_key=idempotency_key,
            )
        )

    # Destructive (consent withdrawn, data erased) and idempotent: a repeat finds nothing
    # left to withdraw.
    @server.tool(
        annotations=ToolAnnotations(
            title="Forget",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=True,
            open_world_hint=False,
        )
    )
    def forget(
        subject: Annotated[str, Field(description="The user reference.")],
        consent_id: Annotated[
            str | None, Field(description="One consent to withdraw; default: all of this app's.")
        ] = None,
        item_id: Annotated[
            str | None, Field(description="Erase this one profile item instead (policy-gated).")
        ] = None,
        erase: Annotated[
            bool, Field(description="Also erase what was collected under the consent(s).")
        ] = False,
    ) -> ForgetResult:
        """Forget what the user shared with this app.

        By default withdraw this app's consent(s): nothing is captured or served under
        them from the next request on; with erase=true what they collected is erased
        too (signed receipts). With item_id, erase that one item instead, which the
        policy allows only to apps holding the erase right.
        """

        def run(s: AppScope) -> ForgetResult:
            if item_id is not None:
                receipt = s.erase_item(w.ItemErasureIn(subject=subject, item_id=item_id))
                return ForgetResult(erasures=[receipt])
            asked: list[w.Consent] = []
            cursor = None
            # Without erase, the consents in force come from the subject's stream: a
            # withdrawal must not wait for the views (a lagging pipeline, or this app's
            # own captures keeping it busy, would hold it off).
            if not erase:
                asked = s.held_consents(subject)
            while erase:  # every page: "forget" means every consent, however many
                page = s.consents(
                    w.ConsentListIn(subject=subject, cursor=cursor, limit=w.MAX_PAGE_LIMIT)
                )
                # With erase, a consent withdrawn with erase is asked again too: its
                # erasure may have answered erasure_incomplete (finished now, with the
                # receipt of that request); one that finished has nothing left to erase.
                asked += [
                    c
                    for c in page.consents
                    if c.withdrawn_at is None or (erase and c.erase_requested)
                ]
                cursor = page.next_cursor
                if cursor is None:
                    break
            targets = [c.consent_id for c in asked if consent_id in (None, c.consent_id)]
            if consent_id is not None and not targets:
                raise EdgeError(
                    404,
                    "consent_not_found",
                    "this app has no live consent with that id for the subject",
                )
            fresh = {c.consent_id for c in asked if c.withdrawn_at is None}
            result = ForgetResult()
            for target in targets:
                done = s.withdraw_consent(
                    w.ConsentWithdrawIn(subject=subject, consent_id=target, erase=erase)
                )
                if done.consent.consent_id in fresh:
                    result.withdrawn.append(done.consent)
                if done.erasure is not None:
                    result.erasures.append(done.erasure)
            return result

        return call(run)

    @server.resource(
        "uprof://profile/{subject}",
        name="profile",
        description="Everything this app may see of the user's profile (policy, consent and "
        "sharing applied), as a JSON profile slice for purpose 'personalization'.",
        mime_type="application/json",
    )
    def profile(subject: str) -> str:
        try:
            result = call(
                lambda s: s.slice(
                    w.SliceIn(
                        subject=subject,
                        query="",
                        budget_tokens=w.MAX_BUDGET_TOKENS,
                        purpose="personalization",
                        agent_id=_resource_agent(s),
                    )
                )
            )
        except UprofToolError as error:
            raise _resource_error(error) from None
        except Exception:
            # A fault: left to the SDK it is logged with the URI, which holds the subject
            # reference (I9), and answered with a generic text. Logged here without it,
            # answered as the tools' faults are, REST's 500 body (bug QP).
            _log.exception("the profile resource failed")
            raise MCPError(code=INTERNAL_ERROR, message=internal_body().model_dump_json()) from None
        return result.model_dump_json()

    return server


#: Open MCP sessions one API key may hold at once on one server process. The SDK holds at
#: most 10,000 per process, every key's together, each until it is deleted or idle for 30
#: minutes; an MCP client keeps one per connection.
DEFAULT_MAX_SESSIONS_PER_KEY = 100


def http_app(
    server: MCPServer,
    *,
    path: str = "/mcp",
    host: str = "127.0.0.1",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_sessions_per_key: int = DEFAULT_MAX_SESSIONS_PER_KEY,
) -> ASGIApp:
    """The server over streamable HTTP at ``path``, refusing a request body over
    ``max_body_bytes`` with 413 before it is read (the MCP SDK reads a body whole into
    memory before parsing it), as the REST API does, and a new session of a key that
    already holds ``max_sessions_per_key`` (429 ``too_many_sessions``)."""
    app: ASGIApp = server.streamable_http_app(streamable_http_path=path, host=host)
    _quiet_refused_headers()
    api_keys = server.api_keys if isinstance(server, UprofMCPServer) else None
    if api_keys is not None:
        app = SessionsPerKeyMiddleware(app, server.session_manager, api_keys, max_sessions_per_key)
        limiter = server.limiter if isinstance(server, UprofMCPServer) else None
        if limiter is not None:
            owners = getattr(server.session_manager, "_session_owners", None)
            app = KeyCountedMiddleware(app, api_keys, limiter, owners)
    return BodySizeLimitMiddleware(OutageAnsweredMiddleware(app), max_body_bytes=max_body_bytes)


#: The SDK's logger of requests refused for their ``Host`` or ``Origin`` header.
_TRANSPORT_SECURITY_LOGGER = "mcp.server.transport_security"


class _RefusedHeaderNamedNotQuoted(logging.Filter):
    """The SDK logs a request refused for its ``Host`` or ``Origin`` header with the header
    whole, a warning per request: a key sending an 8 KB ``Host`` wrote 25 KB of log per
    request, and rendering it held the event loop, so every other app's requests waited
    (another key's p50 from 2 ms to 3.5 s under two such clients; hostile callers round 6,
    bug FW). The record keeps its level and says which header, never its value."""

    def filter(self, record: logging.LogRecord) -> bool:
        # The SDK's texts: "Invalid Origin header: <value>", "Invalid Host header: <value>",
        # "Missing Host header in request"; the value is the caller's, so only the prefix
        # is read. Any other record (a newer SDK's) keeps its own text, cut short: named
        # as a refused Host it was a false line, its text lost (review of 0130, bug GF).
        text = str(record.msg)
        if text.startswith("Invalid Origin"):
            named = "refused an MCP request: its Origin header is not allowed"
        elif text.startswith("Invalid Host"):
            named = "refused an MCP request: its Host header is not allowed"
        elif text.startswith("Missing Host"):
            named = "refused an MCP request: it has no Host header"
        else:
            try:
                named = record.getMessage()[:_OTHER_RECORD_CHARS]
            except (TypeError, ValueError):  # arguments that do not fit: the text alone
                named = text[:_OTHER_RECORD_CHARS]
        record.msg = named
        record.args = ()
        return True


#: The most of a record of the SDK's logger the filter does not know that is kept.
_OTHER_RECORD_CHARS = 200


_QUIET = _RefusedHeaderNamedNotQuoted()


def _quiet_refused_headers() -> None:
    """Install the filter once on the SDK's logger (it is a process-wide object)."""
    logger = logging.getLogger(_TRANSPORT_SECURITY_LOGGER)
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)


class KeyCountedMiddleware:
    """Count every HTTP request of an API key against its allowance, whatever it asks.

    REST counts every authenticated request, a refused one included. Here only tool calls
    and resource reads were counted, inside the SDK: ``initialize``, ``ping``,
    ``tools/list``, notifications, a GET stream, a DELETE, and a request the SDK's
    transport refuses for its headers (whose ``Host`` it logs whole) were served without
    limit to a key over its allowance (hostile callers round 6, bug FU: 600 to 2,000
    requests/s, and 0.1 to 12.5 KB of log per request on the two logged ones). Every
    request bearing a valid key is now counted once, before the SDK sees it; over the
    limit it is answered 429 ``rate_limited`` (``Retry-After``), and 503
    ``rate_limit_unavailable`` when the counters do not answer, with nothing done. A
    request without a valid key is passed on uncounted, as REST does: the SDK refuses
    it 401 (a stranger cannot spend an app's allowance).
    """

    def __init__(
        self,
        app: ASGIApp,
        api_keys: ApiKeyStore,
        limiter: KeyRateLimiter,
        owners: dict[str, Any] | None = None,
    ) -> None:
        """``owners``: the SDK's record of who opened each session (``_session_owners``),
        so that a key may end its own sessions uncounted; None counts every DELETE."""
        self.app = app
        self._api_keys = api_keys
        self._limiter = limiter
        self._owners = owners
        # Sessions whose one uncounted DELETE was taken (served, or refused by the SDK):
        # never exempt again. Ids the SDK has forgotten are pruned (``_spend``).
        self._spent: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            key_id = await _key_id(self._api_keys, scope)
            if key_id is not None and self._own_session_ended(key_id, scope):
                await self.app(scope, receive, send)
                return
            if key_id is not None:
                try:
                    # A database transaction that may wait: never on the loop (bug BF).
                    await anyio.to_thread.run_sync(self._limiter.check, key_id)
                except RateLimitedError as refused:
                    await _refusal(refused, {"Retry-After": str(refused.retry_after_s)})(
                        scope, receive, send
                    )
                    return
                except RateLimitUnavailableError as unavailable:
                    retry = {"Retry-After": str(RATE_LIMIT_UNAVAILABLE_RETRY_AFTER_S)}
                    await _refusal(unavailable, retry)(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _own_session_ended(self, key_id: str, scope: Scope) -> bool:
        """Whether the request is the first DELETE of a session ``key_id`` opened and
        holds (its exemption is taken here); False for any other request (counted).

        Over its allowance a key could not end its sessions (a DELETE was counted like any
        request): they stayed in its session cap and the SDK's table until idle for 30
        minutes, whatever the client did (hostile callers round 7, bug HI). Ending one
        only gives back what the key holds, so it is not counted; a DELETE of an unknown,
        ended or another key's session is. Once per session, not once at a time: a DELETE
        the SDK refuses (a forged ``Host``, the sessionless revision's header) leaves the
        session held, and each such DELETE was uncounted, without limit (review of 0138,
        bug HO). The id is taken with no await between the check and the take, so a burst
        of DELETEs of one session passes one uncounted."""
        if self._owners is None or scope["method"] != "DELETE":
            return False
        ids = [value for name, value in scope.get("headers", ()) if name == b"mcp-session-id"]
        if len(ids) != 1:
            return False
        session_id = str(ids[0].decode("latin-1"))
        owner = self._owners.get(session_id)
        if not isinstance(owner, dict) or owner.get("subject") != key_id:
            return False
        if session_id in self._spent:
            return False
        self._spend(session_id)
        return True

    def _spend(self, session_id: str) -> None:
        """Record the session's exemption as taken. The record holds ids the SDK still
        holds plus those it forgot since the last pruning: pruned when it grows past twice
        the SDK's table, so it stays within a few times the SDK's own bound."""
        owners = self._owners
        if owners is not None and len(self._spent) >= 2 * len(owners) + 64:
            self._spent = {spent for spent in self._spent if spent in owners}
        self._spent.add(session_id)


class OutageAnsweredMiddleware:
    """Answer a request during which the database did not answer, before any answer
    began, as REST does: 503 ``store_unavailable`` with ``Retry-After``. The key's check
    (the SDK's bearer middleware, the session and rate counts) raised the driver's error
    past the SDK, and the server answered a bare 500 (bug OK). Any other driver error,
    or one after the answer began, is left to the server (a fault)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def answering(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, answering)
        except STORE_ERRORS as error:
            answer = store_refusal(error)  # damage too (0214-store-damage-in-servers, SG)
            if answer is None or started:
                raise
            log_store_trouble(answer)
            wait = retry_after_s(answer)
            retry = {} if wait is None else {"Retry-After": str(wait)}
            await _refusal(answer, retry)(scope, receive, send)


def _refusal(error: EdgeError | UprofError, headers: dict[str, str]) -> JSONResponse:
    body = _error_body(error).model_dump(mode="json")
    status = error.status if isinstance(error, EdgeError) else classify(error)[0]
    return JSONResponse(body, status_code=status, headers=headers)


class SessionsPerKeyMiddleware:
    """Refuse an API key's new MCP session while it holds ``limit`` open ones.

    The SDK refuses every new session once ``max_sessions`` are open, whoever opened them,
    and opening one runs no tool, so the rate limit never counted it: one app's key could
    open sessions until no other app or tenant of the server could start one (hostile
    callers round 5, bug BP). Sessions are counted from the SDK's own record of who opened
    each (the key id our token verifier gives as the subject), so a session that ends
    (deleted, idle, crashed) stops counting when the SDK forgets it.

    A request that may open a session holds a place in the count from the moment it passes
    until the SDK has registered its session (its answer starts) or it ends: the SDK
    registers a session only after its own bearer check (a key read in a worker thread),
    so counting registered sessions alone let every request of a burst sent together pass
    while none was registered yet, as many sessions as the key could send requests at once
    (review of 0117). The count and the place are taken with no await between them, so on
    the one event loop no two requests see the same count.
    """

    def __init__(self, app: ASGIApp, manager: Any, api_keys: ApiKeyStore, limit: int) -> None:
        if limit < 1:
            raise ValueError("max_sessions_per_key must be at least 1")
        owners = getattr(manager, "_session_owners", None)
        if not isinstance(owners, dict):
            # Fail at start, not open: without the SDK's record nothing could be counted.
            raise RuntimeError("this MCP SDK keeps no session owners: cannot count sessions")
        self.app = app
        self._owners: dict[str, Any] = owners
        self._api_keys = api_keys
        self.limit = limit
        # Requests of each key that passed the count and whose session the SDK has not yet
        # registered (or refused).
        self._opening: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not _has_session(scope)
            and not _sessionless(scope)
        ):
            key_id = await _key_id(self._api_keys, scope)
            if key_id is not None:
                # No await from the count to the place taken: the check is atomic.
                if self._open(key_id) + self._opening.get(key_id, 0) >= self.limit:
                    refused = EdgeError(
                        429,
                        "too_many_sessions",
                        f"this API key already holds {self.limit} open MCP sessions",
                        hint="reuse an open session, or end one you no longer use (HTTP "
                        "DELETE with its Mcp-Session-Id); an idle session ends after 30 minutes",
                    )
                    body = refused.body().model_dump(mode="json")
                    await JSONResponse(body, status_code=429)(scope, receive, send)
                    return
                await self._opening_session(key_id, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _opening_session(
        self, key_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve a request that may open a session of ``key_id``, holding its place in the
        count until the SDK has registered the session: the SDK registers it before it
        starts the answer, so from then on ``_session_owners`` counts it (and a refused
        one until the SDK drops it, a moment later: counted twice, never missed)."""
        self._opening[key_id] = self._opening.get(key_id, 0) + 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                left = self._opening.pop(key_id) - 1
                if left:
                    self._opening[key_id] = left

        async def answering(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, answering)
        finally:
            release()

    def _open(self, key_id: str) -> int:
        # The SDK's owners are ``AuthorizationContext`` dicts (client_id, issuer, subject).
        return sum(1 for owner in list(self._owners.values()) if owner.get("subject") == key_id)


async def _key_id(api_keys: ApiKeyStore, scope: Scope) -> str | None:
    """The key id of the request's bearer token; None for none or an invalid one (the
    SDK's bearer check answers those with 401)."""
    token = _bearer(scope)
    if token is None:
        return None
    principal = api_keys.authenticate_cached(token)
    if isinstance(principal, NeedsRead):
        principal = await anyio.to_thread.run_sync(api_keys.authenticate, token)
    return None if principal is None else principal.key_id


def _has_session(scope: Scope) -> bool:
    return any(name == b"mcp-session-id" for name, _ in scope.get("headers", ()))


def _sessionless(scope: Scope) -> bool:
    """Whether the SDK serves the request on its sessionless path (opening no session):
    its first ``mcp-protocol-version`` names a revision other than those that open one
    with ``initialize``, read as the SDK's session manager reads it. Such a request was
    refused ``too_many_sessions`` for sessions it does not open, and once a request
    holds a place in the count until answered, a key's concurrent sessionless calls
    would have been counted as sessions (review of 0117)."""
    version = next(
        (value for name, value in scope.get("headers", ()) if name == _PROTOCOL_VERSION), None
    )
    return version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS


_PROTOCOL_VERSION = MCP_PROTOCOL_VERSION_HEADER.encode("ascii")


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def _resource_error(error: UprofToolError) -> MCPError:
    """A refused resource read as a protocol error whose message is the REST body.

    Not a ``ResourceError``, and not any other exception: the SDK logs both with the
    resource's URI, and the URI holds the subject reference (I9: no subject reference
    in a log). An ``MCPError`` goes to the caller as it is, unlogged, with no ``data``.
    """
    return MCPError(code=INTERNAL_ERROR, message=str(error))


def _resource_agent(scope: AppScope) -> str:
    # Resources carry no agent argument; read as the app itself, so private items of
    # individual agents stay with those agents (I4).
    return f"{scope.app_id}#mcp-resource"
