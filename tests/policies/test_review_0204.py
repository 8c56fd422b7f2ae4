"""Review of 0204 (bugs QX-): its policy-outage change met by ``uprof import`` in a real
process, on SQLite and PostgreSQL.

Bug QX: 0204 made a policy check that could not consult its store raise the store's
error (``_refusal_of``); ``uprof import`` catches every ``UprofError`` of a record's
policy check as where the run stopped and exited 1, whatever stopped it. A policy store
found damaged (its rows removed) therefore exited 1 without the damage's hint, where
docs/cli.md's table, and every other command (bug QG), say 7 "Restore it from a backup".
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Backend
from tests.kernel.conftest import APP
from tests.policies.test_policy_store_tampered import _deployment, _empty_policy_table, _said


def _file(tmp_path: Path) -> Path:
    record = {
        "subject": "alice",
        "app_id": APP,
        "agent_id": "agent:one",
        "user_input": "I like tea",
        "occurred_at": "2026-02-01T10:00:00Z",
        "purpose": "personalization",
        "source_ref": "r1",
    }
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def test_qx_import_on_a_damaged_policy_store_exits_7_with_the_damage(
    backend: Backend, tmp_path: Path
) -> None:
    """Bug QX. On main: exit 1, "stopped after 1 records: policy store damaged ...",
    no hint."""
    settings = _deployment(backend)
    _empty_policy_table(backend, settings)
    for dry in ((), ("--dry-run",), ("--strict",)):
        code, said = _said(settings, "import", str(_file(tmp_path)), *dry)
        assert code == 7, (dry, code, said)
        assert "policy store damaged (stored_data_damaged)" in said, (dry, said)
        assert "Restore it from a backup (uprof restore)" in said, (dry, said)
