"""An import record the stream holds already is reported "skipped" only under consent.

Decision 0067 made a keyed retry decided again like a fresh call, and left the import
alone: a record whose ``idempotency_key`` or ``source_ref`` the subject's stream holds was
counted as skipped with the consent of the run's first look at that (subject, app,
purpose), and the write path skipped such a record before asking for consent. A consent
withdrawn while a run went on (the app's own run, or the subject meanwhile) left the
run's later records "skipped", i.e. the app was told the subject still holds them, where
a fresh record got "no consent" (found 2026-12-05; counts only, but the answer under a
withdrawn consent must say nothing of the subject). Consent is now decided again for
every chunk, as the policy is, and at the write, before any token is matched.
"""

from __future__ import annotations

import pytest

from domain.errors import ConsentRequiredError
from tests.kernel.conftest import consent, say
from tests.kernel.test_import_idempotency import record
from uprof.kernel import Uprof
from uprof.services import importer
from uprof.services.importer import import_interactions


def test_a_consent_withdrawn_during_a_run_fails_the_records_it_held(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent_id = consent(kernel)
    lines = [record("keyed", key="k-1"), record("by ref", ref="conv-1:1")]
    assert import_interactions(kernel, lines).captured == 2
    monkeypatch.setattr(importer, "CHUNK", 1)

    chunks: list[int] = []

    def withdraw_after_the_first_chunk(n: int) -> None:
        chunks.append(n)
        if len(chunks) == 1:
            kernel.withdraw_consent("alice", consent_id)

    again = import_interactions(kernel, lines, progress=withdraw_after_the_first_chunk)

    assert again.skipped == 1  # the first chunk, under the consent then in force
    assert [(p.where, p.field) for p in again.failed] == [("line 2", "subject")]


def test_the_write_decides_consent_before_it_matches_a_held_token(kernel: Uprof) -> None:
    consent_id = consent(kernel)
    token = kernel.request_token("app:planner", "k-1")
    first = kernel.capture_once("alice", [say("I like tea")], item_tokens=[token])
    assert len(first.acks) == 1
    kernel.withdraw_consent("alice", consent_id)

    with pytest.raises(ConsentRequiredError):
        kernel.capture_once("alice", [say("I like tea")], item_tokens=[token])
