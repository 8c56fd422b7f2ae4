"""``uprof serve`` (the REST API under uvicorn) and ``uprof apps create|list|revoke``.

``register(app)`` adds both to the main Typer app; uprof/cli/main.py calls it.
The server builds its settings with ``background_workers=True``: extraction and
projections run in a background thread and reads wait for them (bounded) instead
of doing the work on request threads.
"""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Annotated

import typer

from domain.errors import UprofError
from uprof.backends import SchemaLockWaitStopped
from uprof.cli.context import (
    CheckedTyper,
    console,
    door,
    err_console,
    fail,
    port_option,
    settings,
    stopped_early,
)

apps_app = CheckedTyper(no_args_is_help=True, help="Create, list and revoke app API keys.")


def serve(
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, port_option("TCP port (0-65535).")] = 8765,
    fd: Annotated[
        int | None,
        typer.Option(
            help="Serve on this already-listening socket, inherited from the process that "
            "started this one (socket activation; --host and --port are then unused).",
        ),
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body accepted.")] = 1_048_576,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    rate_limit: Annotated[
        str | None,
        typer.Option(
            help="Requests per API key, e.g. 50/second;1000/minute (UPROF_RATE_LIMIT); "
            "over it, 429 with Retry-After."
        ),
    ] = None,
    run_worker: Annotated[
        bool,
        typer.Option(
            "--worker/--no-worker",
            help="Run extraction and projections in this server (--no-worker: "
            "`uprof worker` processes do; reads wait for them).",
        ),
    ] = True,
    api_docs: Annotated[
        bool | None,
        typer.Option(
            "--api-docs/--no-api-docs",
            help="Serve Swagger UI (/docs) and ReDoc (/redoc) (UPROF_API_DOCS, default on); "
            "turn them off where the privacy center is served (docs/security.md).",
        ),
    ] = None,
) -> None:
    """Serve the REST API (OpenAPI at /docs); extraction and projections run in the background."""
    import uvicorn

    from uprof.api import ApiKeyStore
    from uprof.api.logconfig import server_log_config
    from uprof.bootstrap import bootstrap
    from uprof.native_memory import limit_malloc_arenas
    from uprof.server import create_server

    server_settings = settings().model_copy(
        update={"background_workers": True, "run_worker": run_worker}
    )
    # Before any thread starts (the model's, the pipeline's, uvicorn's pool).
    limit_malloc_arenas(server_settings.malloc_arenas)
    if rate_limit is not None:
        from uprof.settings import parse_rate_limit

        try:
            parse_rate_limit(rate_limit)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="'--rate-limit'") from None
        server_settings = server_settings.model_copy(update={"rate_limit": rate_limit})
    if api_docs is not None:
        server_settings = server_settings.model_copy(update={"api_docs": api_docs})
    listener = _inherited_socket(fd) if fd is not None else _any_free_port(host, port)
    try:
        kernel = bootstrap(server_settings)
    except SchemaLockWaitStopped as e:
        # SIGTERM or SIGINT while the start waited (bug OA): a clean stop, exit 0, as
        # uvicorn's after them once serving.
        stopped_early("uprof serve", e)
        return
    except UprofError as e:
        fail(e)
        return
    keys = ApiKeyStore.open(server_settings)
    try:
        api = create_server(
            kernel, keys, max_body_bytes=max_body_bytes, rate_limit=server_settings.rate_limit
        )
        if listener is not None:
            host, port = listener.getsockname()[:2]
        if server_settings.log_format == "text":
            # With JSON logs every line is JSON; uvicorn's own start line gives the address.
            docs = "/docs" if server_settings.api_docs else "/openapi.json"
            console.print(f"uprof API on http://{host}:{port} (OpenAPI at {docs})")
        config = uvicorn.Config(
            api,
            host=host,
            port=port,
            log_level=log_level,
            log_config=server_log_config(log_level, server_settings.log_format),
        )
        server = uvicorn.Server(config)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C: a clean stop, as uvicorn.run
            server.run(sockets=[listener] if listener is not None else None)
        if not server.started:
            raise typer.Exit(3)  # uvicorn.run's exit code when the server cannot start
    finally:
        keys.close()
        kernel.close()


def _any_free_port(host: str, port: int) -> socket.socket | None:
    """For ``--port 0``, the socket bound here on a port the system picks, so the start
    line names it (it printed ":0", and only uvicorn's own line the real port:
    0209-cli-truths's Left, 0214-store-damage-in-servers bug SM); None for a port named,
    which uvicorn binds (a port taken is its exit 3)."""
    if port != 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, 0), family=family)
    except OSError as e:
        raise typer.BadParameter(
            f"cannot listen on {host} ({e.strerror})", param_hint="'--host'"
        ) from None


def _inherited_socket(fd: int) -> socket.socket:
    """The listening TCP socket at file descriptor ``fd``, or a clear error naming --fd.

    Whoever started this process bound and listened (so no other process can take the
    port between a pick and a bind, and a restarted server gets the very same socket)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise typer.BadParameter(
            f"{fd} is not an open socket ({e.strerror})", param_hint="'--fd'"
        ) from None
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.detach()
        raise typer.BadParameter(f"{fd} is not a TCP socket", param_hint="'--fd'")
    if not listening:
        sock.detach()
        raise typer.BadParameter(f"{fd} is a TCP socket that is not listening", param_hint="'--fd'")
    return sock


@apps_app.command("create")
def apps_create(
    app_id: Annotated[
        str, typer.Argument(help="The app's id as the policy names it, e.g. app:planner.")
    ],
    role: Annotated[
        list[str] | None, typer.Option(help="Repeat: app (default), operator (full profile reads).")
    ] = None,
    read: Annotated[
        list[str] | None,
        typer.Option(help="Onboard: categories the app may read (repeat or a,b); needs --purpose."),
    ] = None,
    purpose: Annotated[
        str | None, typer.Option(help="Onboard: the purpose it reads, captures and proposes for.")
    ] = None,
    capture: Annotated[
        list[str] | None,
        typer.Option(help="Onboard: categories it may capture (default: the --read ones)."),
    ] = None,
    propose: Annotated[
        list[str] | None,
        typer.Option(help="Onboard: categories it may propose (default: the --read ones)."),
    ] = None,
) -> None:
    """Issue an API key for an app; the key is printed once and never stored in plaintext.

    With --read and --purpose the app is onboarded in the same step: the policy grants it
    read, capture and propose of those categories for that purpose (direct rules on the
    app, recorded as policy events and audited), before the key is issued.
    """
    from uprof.cli.policy import split_names

    onboarding = bool(read or capture or propose or purpose)
    if onboarding and (not read or not purpose):
        console.print("[bold red]error:[/] onboarding needs --read and --purpose together")
        raise typer.Exit(2)
    try:
        with door(creates=True) as d:
            if onboarding:
                result = d.onboard_app(
                    app_id,
                    read=split_names(read or []),
                    purpose=purpose or "",
                    capture=None if capture is None else split_names(capture),
                    propose=None if propose is None else split_names(propose),
                )
                console.print(
                    f"policy version {result.version}: {len(result.changes)} rules granted "
                    f"to {app_id}"
                )
            issued = d.issue_api_key(app_id, role or ["app"])
    except UprofError as e:
        fail(e)
        return
    console.print(
        f"key id [bold]{issued.info.key_id}[/] for {app_id} (roles: {' '.join(issued.info.roles)})"
    )
    console.print("API key (shown once, store it now):")
    # Plain print: rich would wrap or colour the key, and scripts capture this line.
    print(issued.token)


@apps_app.command("list")
def apps_list(
    app_id: Annotated[str | None, typer.Option("--app", help="Only this app's keys.")] = None,
) -> None:
    """List API keys (ids, apps, roles, dates; never the keys themselves). Audited."""
    try:
        with door() as d:
            rows = d.list_api_keys(app_id)
    except UprofError as e:
        fail(e)
        return
    console.print_json(
        json.dumps(
            [
                {
                    "key_id": r.key_id,
                    "app_id": r.app_id,
                    "roles": list(r.roles),
                    "created_at": r.created_at.isoformat(),
                    "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
                }
                for r in rows
            ]
        )
    )


@apps_app.command("revoke")
def apps_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id from `uprof apps list`.")],
) -> None:
    """Revoke an API key: the next request with it gets 401."""
    with door() as d:
        revoked = d.revoke_api_key(key_id)
    if not revoked:
        # 5, as an unknown subject: what scripts were told (docs/cli.md's table says so).
        err_console.print(f"[bold red]error:[/] no live key with id {key_id}", highlight=False)
        raise typer.Exit(5)
    console.print(f"key {key_id} revoked")


def register(app: typer.Typer) -> None:
    """Add ``serve`` and the ``apps`` group to the main CLI."""
    app.command("serve")(serve)
    app.add_typer(apps_app, name="apps")
