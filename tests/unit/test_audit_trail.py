"""The production audit trail over the in-memory audit store."""

from __future__ import annotations

import pytest

from audit.errors import AuditEntryError
from tests.unit.conftest import World, grant


def test_an_entry_with_a_field_off_the_allowlist_is_refused(world: World) -> None:
    with pytest.raises(AuditEntryError):
        world.audit.record("consent.granted", subject_ref="subj_x", email="alice@example.org")
    assert world.audit_log.size() == 0


def test_service_entries_carry_pseudonyms_never_the_reference(world: World) -> None:
    grant(world, subject="alice@example.org")
    key, entry = list(world.audit_log.entries())
    assert (key.entry["action"], entry.entry["action"]) == ("key.created", "consent.granted")
    assert entry.entry["subject_ref"] == key.entry["subject_ref"]
    assert entry.entry["subject_ref"].startswith("subj_")
    assert "alice" not in entry.entry_json + key.entry_json
