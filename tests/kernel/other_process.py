"""A second real process on the same stores as a test's kernel (erasure tests).

Each call starts a process of its own (forked from the tests' fork server, which has the
project imported: tests/children.py) that builds its own kernel on the backend's stores,
as another server or CLI run would, so nothing is shared but the stores themselves.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from typing import Any

from tests.children import run_python
from tests.conftest import Backend


def run_in_another_process(
    backend: Backend, body: str, *, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (Python with ``kernel`` bound; the kernel is closed after it, unless
    the process dies first) in another process."""
    script = textwrap.dedent(
        f"""
        import json, os
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, settings_for

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = build_kernel(settings_for(backend), FakeClock())
        try:
        """
    )
    script += textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"
    script += "finally:\n    kernel.close()\n"
    return run_python(script, timeout=timeout_s)


def receipt_from_another_process(backend: Backend, call: str) -> dict[str, Any]:
    """The receipt of ``kernel.<call>`` run in another process (which must succeed)."""
    done = run_in_another_process(backend, f"print(json.dumps(kernel.{call}.receipt))")
    assert done.returncode == 0, done.stderr[-3000:]
    receipt: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return receipt


def crash_at(
    backend: Backend, patch: str, call: str, owner: str = "kernel.keystore"
) -> subprocess.CompletedProcess[str]:
    """Run ``kernel.<call>`` in another process that dies (exit 9, as kill -9 leaves no
    cleanup) at the moment ``patch`` names: a method of ``owner`` replaced by
    ``os._exit(9)``."""
    return run_in_another_process(
        backend,
        f"""
        setattr({owner}, {patch!r}, lambda *args, **kwargs: os._exit(9))
        kernel.{call}
        """,
    )
