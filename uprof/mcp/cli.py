"""``uprof mcp``: run the MCP server over stdio or streamable HTTP.

``register(app)`` adds the command to the main CLI (uprof/cli/main.py calls it);
``python -m uprof.mcp`` runs the same command on its own, with the global options
(--data-dir, --database-url, --embedder) of the main CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from domain.errors import UprofError
from uprof.backends import SchemaLockWaitStopped
from uprof.cli.context import (
    STATE,
    CheckedTyper,
    err_console,
    fail,
    port_option,
    settings,
    stopped_early,
)

#: The REST server's default (``uprof serve --max-body-bytes``), without importing it at start.
DEFAULT_MAX_BODY_BYTES = 1_048_576

#: ``uprof.mcp.server.DEFAULT_MAX_SESSIONS_PER_KEY``, without importing it at start.
DEFAULT_MAX_SESSIONS_PER_KEY = 100

API_KEY_ENV = "UPROF_API_KEY"


def mcp(
    transport: Annotated[
        str, typer.Option(help="stdio (one app per process, key in UPROF_API_KEY) or http.")
    ] = "stdio",
    host: Annotated[str, typer.Option(help="HTTP: interface to bind.")] = "127.0.0.1",
    port: Annotated[int, port_option("HTTP: TCP port (0-65535).")] = 8766,
    path: Annotated[str, typer.Option(help="HTTP: endpoint path.")] = "/mcp",
    max_body_bytes: Annotated[
        int,
        typer.Option(
            help="Largest request accepted: an HTTP body (413 over it) or a stdio message "
            "line (a JSON-RPC error over it, the line dropped).",
        ),
    ] = DEFAULT_MAX_BODY_BYTES,
    max_sessions_per_key: Annotated[
        int,
        typer.Option(
            min=1,
            help="HTTP: open MCP sessions one API key may hold at once (429 "
            "too_many_sessions over it; a session ends when deleted or idle 30 minutes).",
        ),
    ] = DEFAULT_MAX_SESSIONS_PER_KEY,
) -> None:
    """Serve the MCP tools profile_slice, capture and forget, and the profile resource."""
    if transport not in ("stdio", "http"):
        raise typer.BadParameter("transport must be stdio or http")
    # The cap was a constant of ``http_app`` (decision 0117): a deployment serving more
    # conversations at once through one key than that had no way to raise it (review of
    # 0117).
    run(
        transport,  # type: ignore[arg-type]
        host=host,
        port=port,
        path=path,
        max_body_bytes=max_body_bytes,
        max_sessions_per_key=max_sessions_per_key,
    )


def run(
    transport: Literal["stdio", "http"],
    *,
    host: str,
    port: int,
    path: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_sessions_per_key: int = DEFAULT_MAX_SESSIONS_PER_KEY,
) -> None:
    from uprof.api.runtime import ServiceRuntime
    from uprof.apikeys.store import ApiKeyStore
    from uprof.bootstrap import bootstrap
    from uprof.mcp.server import build_server, http_app
    from uprof.native_memory import limit_malloc_arenas
    from uprof.settings import EnvironmentValueError, environment_value

    server_settings = settings().model_copy(update={"background_workers": True})
    # The one variable the edge reads apart from the settings: the MCP client that
    # spawns the server passes the key this way (stdio has no headers). Read before the
    # start, and refused as a setting of the same text is (bug PD: a byte that is not
    # UTF-8 was taken for a revoked key, after the start).
    try:
        stdio_key = environment_value(API_KEY_ENV)
    except EnvironmentValueError as e:
        err_console.print(f"[bold red]error:[/] configuration: {e}", highlight=False)
        raise typer.Exit(2) from None
    limit_malloc_arenas(server_settings.malloc_arenas)  # before any thread starts
    try:
        kernel = bootstrap(server_settings)
    except SchemaLockWaitStopped as e:
        # SIGTERM or SIGINT while the start waited (bug OA): a clean stop, exit 0, as
        # after them once serving.
        stopped_early("uprof mcp", e)
        return
    except UprofError as e:
        fail(e)
        return
    # After the start, as ``uprof serve`` does: opening the key store upgrades its
    # schema, which only the start does, under the schema lock. Opened first, it
    # upgraded the key store beside another process's upgrade, and before this
    # process's own wait for the lock, so that a start stopped in that wait had
    # changed the store (bug OE).
    keys = ApiKeyStore.open(server_settings)
    principal = None
    if transport == "stdio":
        principal = keys.authenticate(stdio_key)
        if principal is None:
            keys.close()
            kernel.close()
            err_console.print(f"error: {API_KEY_ENV} is missing, invalid or revoked")
            raise typer.Exit(3)
    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    try:
        if transport == "stdio":
            # Checked again before every call: a revoked key stops the session.
            build_server(
                runtime,
                stdio_principal=principal,
                stdio_check=lambda: keys.authenticate(stdio_key),
                rate_limit=server_settings.rate_limit,
                max_message_bytes=max_body_bytes,
            ).run("stdio")
        else:
            import uvicorn

            from uprof.api.logconfig import server_log_config

            server = build_server(
                runtime,
                keys,
                issuer_url=f"http://{host}:{port}",
                rate_limit=server_settings.rate_limit,
            )
            app = http_app(
                server,
                path=path,
                host=host,
                max_body_bytes=max_body_bytes,
                max_sessions_per_key=max_sessions_per_key,
            )
            uvicorn.run(
                app,
                host=host,
                port=port,
                log_level="warning",
                log_config=server_log_config("warning", server_settings.log_format),
            )
    finally:
        runtime.stop()
        kernel.close()
        keys.close()


def register(app: typer.Typer) -> None:
    """Add ``mcp`` to the main CLI."""
    app.command("mcp")(mcp)


def standalone() -> typer.Typer:
    """A CLI with only ``mcp`` and the main CLI's global options (for ``python -m uprof.mcp``)."""
    cli = CheckedTyper(add_completion=False, help=__doc__)

    @cli.callback(invoke_without_command=False)
    def options(
        data_dir: Annotated[Path | None, typer.Option()] = None,
        database_url: Annotated[str | None, typer.Option()] = None,
        embedder: Annotated[str | None, typer.Option()] = None,
    ) -> None:
        STATE.data_dir = data_dir
        STATE.database_url = database_url
        STATE.embedder = embedder

    register(cli)
    return cli
