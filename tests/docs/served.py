"""A document's own loopback server: what a reader of docs/api.md has running when they
reach the SDK examples (decision 0226-a-new-users-walk).

The document's "Run the server" block stays skipped (it runs until stopped); this does
what it says in the document's folder: a key for ``app:planner`` and an operator key for
``app:console`` in the data folder's key store (as ``uprof apps create`` writes them), and
``uprof --data-dir ./data serve`` on loopback, as a real process. The blocks then find
``url``, ``api_key`` (the app's) and ``operator_key`` in their namespace, the names the
document gives them.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.server_ready import popen_serving, stop_server, wait_until_healthy

# Documents whose examples call a running server; every other one runs without.
SERVED_DOCUMENTS = frozenset({"docs/api.md"})


@contextlib.contextmanager
def serving_the_document(workdir: Path, env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Keys and a live ``uprof serve`` on ``workdir/data``; yields the names the
    document's blocks use. The server is stopped (SIGTERM, then SIGKILL) on the way out."""
    from uprof.api import ApiKeyStore
    from uprof.settings import Settings

    keys = ApiKeyStore.open(Settings(data_dir=workdir / "data"))
    try:
        api_key = keys.create("app:planner").token
        operator_key = keys.create("app:console", roles=("app", "operator")).token
    finally:
        keys.close()
    log = workdir / "serve.log"
    with log.open("w", encoding="utf-8") as out:
        command = [sys.executable, "-m", "uprof.cli.main", "--data-dir", "data", "serve"]
        server, port = popen_serving(
            [*command, "--host", "127.0.0.1"],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url, exited=lambda: log.read_text(encoding="utf-8")[-3000:])
        yield {"url": url, "api_key": api_key, "operator_key": operator_key}
    finally:
        stop_server(server)
