"""``uprof export-subject --out`` writes the subject's data readable by its owner only
(SQLite and PostgreSQL).

The export is everything held about a person, in plaintext (captures, items, consents).
Until 2026-12-05 it was written with the process's umask (0644 under the usual 022): on
a shared host every local account could read it, where the data folder beside it holds
only ciphertext and the key folder is 0700. A file that already existed kept its mode.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.kernel.test_admin_audit import cli_for


@pytest.fixture
def usual_umask() -> Iterator[None]:
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _grant_and_capture(run: object) -> None:
    run(  # type: ignore[operator]
        "consent",
        "grant",
        "--subject",
        "alice",
        "--app",
        "app:planner",
        "--category",
        "*",
        "--purpose",
        "personalization",
        "--collected-by",
        "form:1",
    )
    run(  # type: ignore[operator]
        "capture",
        "--subject",
        "alice",
        "--app",
        "app:planner",
        "--agent",
        "agent:one",
        "--text",
        "I live in Lyon",
    )


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_a_subject_export_is_readable_by_its_owner_only(
    backend: Backend, tmp_path: Path, usual_umask: None, existing: bool
) -> None:
    run = cli_for(backend)
    _grant_and_capture(run)
    out = tmp_path / "alice.json"
    if existing:
        out.write_text("old\n")
        out.chmod(0o644)
    run("export-subject", "--subject", "alice", "--out", str(out))
    assert "Lyon" in out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
