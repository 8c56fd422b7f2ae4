"""``recovery.withdraw_again`` on both backends: a consent the audit log records as
withdrawn and the views show in force is withdrawn again, once, and audited; a consent the
log already shows withdrawn, or one of an erased subject, is left alone.

The torn folder copy that needs it is SQLite's (tests/kernel/test_torn_folder_copy.py);
here the audit entry is written alone, as such a copy's audit log holds it."""

from __future__ import annotations

from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say
from uprof.kernel import Uprof
from uprof.services.recovery import WITHDRAWAL_REAPPLIED, withdraw_again


def _reapplied(kernel: Uprof) -> list[str]:
    return [
        e.entry["consent_id"]
        for e in kernel.audit_entries(action="consent.withdrawn")
        if e.entry.get("reason_code") == WITHDRAWAL_REAPPLIED
    ]


def test_a_withdrawal_only_the_audit_log_holds_is_written_again_once(kernel: Uprof) -> None:
    lost = consent(kernel)
    done = consent(kernel, "bob")
    erased = consent(kernel, "carol")
    kernel.process()
    kernel.withdraw_consent("bob", done)
    kernel.erase_subject("carol")
    for subject, consent_id in (("alice", lost), ("bob", done), ("carol", erased)):
        kernel.audit.record(
            "consent.withdrawn",
            subject_ref=f"sub_{subject}",
            consent_id=consent_id,
            reason_code="withdrawn",
        )
    kernel.process()

    assert withdraw_again(kernel) == 1
    assert _reapplied(kernel) == [lost]
    kernel.process()
    assert [c.withdrawn_at is not None for c in kernel.profile("alice").consents] == [True]
    assert withdraw_again(kernel) == 0  # the log now holds it: nothing written twice
    assert _reapplied(kernel) == [lost]
    refused = None
    try:
        kernel.capture("alice", say("I live in Qzxporto"))
    except Exception as exc:
        refused = type(exc).__name__
    assert refused == "ConsentRequiredError"


def test_a_start_writes_again_only_its_own_tenants_withdrawals(
    kernel: Uprof, clock: FakeClock
) -> None:
    """Tenants on one set of stores share the audit log and the views: a start of tenant A
    wrote tenant B's lost withdrawals into B's streams and recorded them as A's (A's
    auditors then read B's subject's pseudonym and consent id). Each start now writes
    again its own tenant's (decision 0089-audit-per-tenant); B's start writes B's."""
    other = build_kernel(kernel.settings.model_copy(update={"tenant": "other-tenant"}), clock)
    try:
        theirs = consent(other, "zoe")
        other.process()
        other.audit.record(  # the withdrawal only B's audit log holds (a torn copy's)
            "consent.withdrawn", subject_ref="sub_zoe", consent_id=theirs, reason_code="withdrawn"
        )
        kernel.process()
        assert withdraw_again(kernel) == 0
        assert _reapplied(kernel) == []
        assert withdraw_again(other) == 1
        assert _reapplied(other) == [theirs]
    finally:
        other.close()
