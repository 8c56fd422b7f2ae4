"""Attacks on finishing an erasure that answered ``erasure_incomplete`` (decisions 0051,
0052): asked again in ways the first caller did not, by a second process at the same
moment, after the name was re-created, after a restore. Both backends.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from audit.receipts import verify_receipt
from domain.errors import (
    ErasureIncompleteError,
    InvalidInputError,
    SubjectErasedError,
    UprofError,
)
from projections.profile import tables as t
from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    SAIL,
    build_kernel,
    consent,
    sail_intent_of_alice,
    say,
    settings_for,
)
from tests.kernel.test_erasure import fill_with_canaries
from tests.kernel.test_erasure_resume import projections_stay_behind, rows_left
from tests.kernel.test_erasure_resume import unfinished_request as unfinished_subject_request
from tests.kernel.test_erasure_resume_scopes import (
    capture_ids,
    projections_stall_after_first_wait,
    unfinished_request,
)
from tests.kernel.test_keys_apart import ALICE, BOB, assert_intact, fill
from uprof.crypto.keydir import LEDGER_FILE
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore
from uprof.services.residue import INTERRUPTED


@pytest.mark.parametrize("retry_token", [None, "w-2"], ids=["no-token", "other-token"])
def test_a_withdrawal_erasure_is_finished_without_the_first_request_token(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, retry_token: str | None
) -> None:
    """The first request carried a token (REST: an ``Idempotency-Key``); the retry
    carries none, or another one. The consent is already withdrawn, so withdrawing it
    again is refused; finishing its erasure must not be."""
    consent_id = consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.withdraw_consent("alice", consent_id, erase=True, request_token="w-1")
    request_id = unfinished_request(kernel, "consent-withdrawal", [consent_id])
    assert request_id

    result = kernel.withdraw_consent("alice", consent_id, erase=True, request_token=retry_token)

    assert result is not None
    assert result.receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.profile("alice").memories == ()
    assert capture_ids(kernel) == set()
    assert unfinished_request(kernel, "consent-withdrawal", [consent_id]) is None


def test_a_finished_withdrawal_erasure_asked_again_writes_nothing(kernel: Uprof) -> None:
    """Asking again once it finished answers "nothing left" (no receipt, no write); a
    consent withdrawn without erase is still not withdrawn again to erase."""
    erased, kept = consent(kernel), consent(kernel, app="app:calendar")
    kernel.capture("alice", say("I want to learn to sail"))
    kernel.capture("alice", say("I live in Porto", app="app:calendar"))
    assert kernel.withdraw_consent("alice", erased, erase=True) is not None
    kernel.withdraw_consent("alice", kept)
    kernel.process()
    head = kernel.app.max_notification_id()

    assert kernel.withdraw_consent("alice", erased, erase=True) is None
    assert kernel.withdraw_consent("alice", erased, erase=True, request_token="t") is None
    assert kernel.app.max_notification_id() == head
    with pytest.raises(InvalidInputError, match="no consent"):
        kernel.withdraw_consent("alice", kept, erase=True)


@pytest.mark.parametrize("token", [None, "w-2"], ids=["no-token", "other-token"])
def test_asking_again_for_a_finished_withdrawal_leaves_a_later_consents_data(
    kernel: Uprof, token: str | None
) -> None:
    """The app was granted consent again and collected under it; asking again to erase
    the first (finished) withdrawal must not take what the later consent collected."""
    first = consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    assert kernel.withdraw_consent("alice", first, erase=True, request_token="w-1") is not None
    consent(kernel)
    later = kernel.capture("alice", say("I live in Porto"))
    kernel.process()

    assert kernel.withdraw_consent("alice", first, erase=True, request_token=token) is None

    assert later.capture_id in capture_ids(kernel)
    assert [m.text for m in kernel.profile("alice").memories] == ["I live in Porto"]


def test_a_keyed_retry_of_a_finished_withdrawal_leaves_a_later_consents_data(
    kernel: Uprof,
) -> None:
    first = consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    assert kernel.withdraw_consent("alice", first, erase=True, request_token="w-1") is not None
    consent(kernel)
    later = kernel.capture("alice", say("I live in Porto"))
    kernel.process()

    kernel.withdraw_consent("alice", first, erase=True, request_token="w-1")

    assert later.capture_id in capture_ids(kernel)


def test_a_keyed_retry_racing_its_first_request_takes_only_what_the_consent_collected(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request (another process) withdraws after this one read the consent, and
    a later consent collects at once; this one is then a keyed retry that writes nothing,
    and reads the consent again for the withdrawal's position."""
    first = consent(kernel)
    sail = kernel.capture("alice", say("I want to learn to sail"))
    service = kernel.consent_service
    real = service.withdraw
    later: list[str] = []

    def withdraw(*args: Any, **kwargs: Any) -> int:
        if not later:
            real(*args, **kwargs)  # the first request
            consent(kernel)
            later.append(kernel.capture("alice", say("I live in Porto")).capture_id)
            kernel.process()  # the other process's workers
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "withdraw", withdraw)
    result = kernel.withdraw_consent("alice", first, erase=True, request_token="w-1")

    assert result is not None
    assert capture_ids(kernel) == set(later) and sail.capture_id not in later


def _as_projected_before_migration_0005(kernel: Uprof) -> None:
    """The consent rows as a store projected them before migration 0005: no positions."""
    with kernel.views_engine.begin() as conn:
        conn.execute(t.consents.update().values(granted_position=None, withdrawn_position=None))


def test_a_keyed_retry_of_a_withdrawal_projected_before_its_positions_is_bounded_by_time(
    kernel: Uprof, clock: FakeClock
) -> None:
    """Consent rows from before migration 0005 have no log positions: what was collected
    under them is bounded by time instead (granted_at <= recorded_at <= withdrawn_at).
    The consents' clock is set to the wall clock here, which stamps the captures."""
    clock.current = datetime.now(UTC)
    first = consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    clock.current = datetime.now(UTC)
    assert kernel.withdraw_consent("alice", first, erase=True, request_token="w-1") is not None
    consent(kernel)
    later = kernel.capture("alice", say("I live in Porto"))
    kernel.process()
    _as_projected_before_migration_0005(kernel)

    kernel.withdraw_consent("alice", first, erase=True, request_token="w-1")

    assert later.capture_id in capture_ids(kernel)


def test_a_consent_projected_before_its_positions_is_erased_from_its_grant_time(
    kernel: Uprof, clock: FakeClock
) -> None:
    clock.current = datetime.now(UTC)
    first = consent(kernel)
    consent(kernel, app="app:calendar")
    sail = kernel.capture("alice", say("I want to learn to sail"))
    kept = kernel.capture("alice", say("I live in Porto", app="app:calendar"))
    kernel.process()
    _as_projected_before_migration_0005(kernel)

    assert kernel.withdraw_consent("alice", first, erase=True) is not None

    assert capture_ids(kernel) == {kept.capture_id}
    assert sail.capture_id not in capture_ids(kernel)  # the grant's time bounds it


# ------------------------------------------------------------------- re-created names


def _ledger_kinds(kernel: Uprof) -> list[str]:
    ledger = kernel.keystore.ledger
    assert ledger is not None
    return [r.kind for r in ledger._store.erasure_records()]


def _erased_entirely(kernel: Uprof, stream: str) -> None:
    assert rows_left(kernel, stream) == 0
    with pytest.raises(SubjectErasedError):
        kernel.profile("alice")


def test_an_incomplete_erasure_of_a_recreated_name_does_not_answer_for_the_new_subject(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incomplete, then the operator re-creates the name: erasing the new subject is a
    new erasure of the new stream, not the old request's receipt."""
    fill_with_canaries(kernel, "alice")
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
    old_request = unfinished_subject_request(kernel, "alice")
    kernel.recreate_subject("alice")
    consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    kernel.process()
    new_stream = str(kernel.stream_of("alice"))

    result = kernel.erase_subject("alice")

    body = result.receipt["body"]
    assert body["request"]["request_id"] != old_request
    assert body["actions"][0]["stream"] == new_stream
    _erased_entirely(kernel, new_stream)


def test_a_name_recreated_while_its_erasure_waits_is_erased_anew_when_asked(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator (another process) re-creates the name while the erasure waits for the
    purge; the wait then runs out, so the ``incomplete`` record lands after ``recreated``.
    Erasing the new subject must not be answered with the old request's receipt while
    the new subject's data stays."""
    fill_with_canaries(kernel, "alice")
    old_stream = str(kernel.stream_of("alice"))
    service = kernel.erasure_service
    real = service._catch_up
    waits: list[int] = []

    def catch_up(position: int, timeout: float) -> bool:
        waits.append(position)
        if len(waits) > 1:
            return real(position, timeout)
        kernel.recreate_subject("alice", requested_by="operator:other-process")
        consent(kernel)
        kernel.capture("alice", say("I want to learn to sail"))
        return False

    with monkeypatch.context() as racing:
        racing.setattr(service, "_catch_up", catch_up)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
        assert _ledger_kinds(kernel)[-2:] == ["recreated", "incomplete"]
        kernel.process()
        new_stream = str(kernel.stream_of("alice"))
        assert new_stream != old_stream

        result = kernel.erase_subject("alice")

    assert result.receipt["body"]["actions"][0]["stream"] == new_stream
    _erased_entirely(kernel, new_stream)
    assert rows_left(kernel, old_stream) == 0
    # Both incarnations erased: the old one's draft does not answer for the name either.
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("alice")


def test_an_incomplete_capture_erasure_of_an_erased_incarnation_stays_its_own(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old incarnation: a capture erasure left incomplete, then the whole subject erased.
    New incarnation: naming the old capture finds nothing; its own capture erasure is
    its own request."""
    consent(kernel)
    old = kernel.capture("alice", say("I want to learn to sail"))
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_capture("alice", old.capture_id)
    old_request = unfinished_request(kernel, "capture", [old.capture_id])
    kernel.erase_subject("alice")
    kernel.recreate_subject("alice")
    consent(kernel)
    new = kernel.capture("alice", say("I want to learn to dance"))
    kernel.process()

    with pytest.raises(InvalidInputError, match="no captured event"):
        kernel.erase_capture("alice", old.capture_id)
    result = kernel.erase_capture("alice", new.capture_id)

    assert result.receipt["body"]["request"]["request_id"] != old_request
    assert result.receipt["body"]["actions"][0]["stream"] == str(kernel.stream_of("alice"))
    assert kernel.profile("alice").intents == ()


# ------------------------------------------------------------- two processes at once

_FINISHER = """
import json, sys, time
from pathlib import Path
from domain.errors import UprofError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

kind, url, data_dir, scope, target, barrier, me = sys.argv[1:8]
backend = Backend(kind, url, Path(data_dir))
kernel = build_kernel(settings_for(backend), FakeClock())
try:
    Path(barrier, f"ready-{me}").touch()
    waited_until = time.monotonic() + 600  # a parent that failed never says go
    while not Path(barrier, "go").exists():
        if time.monotonic() > waited_until:
            sys.exit("no go within 600 s")
        time.sleep(0.005)
    try:
        if scope == "subject":
            result = kernel.erase_subject("alice")
        else:
            result = kernel.erase_capture("alice", target)
        print(json.dumps({"receipt": result.receipt}))
    except UprofError as refused:
        print(json.dumps({"refused": type(refused).__name__, "message": str(refused)}))
finally:
    kernel.close()
"""


@pytest.mark.parametrize("scope", ["subject", "capture"])
def test_two_processes_finish_the_same_incomplete_erasure_at_once(
    backend: Backend,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    scope: str,
) -> None:
    """Each gets the receipt of the original request or is refused as the erasure being
    finished (erased name, capture gone); no exception, the ledger stays whole, the audit
    log verifies and nothing is left to finish."""
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    target = sorted(capture_ids(kernel))[0]
    with monkeypatch.context() as behind, pytest.raises(ErasureIncompleteError):
        if scope == "subject":
            projections_stay_behind(kernel, behind)
            kernel.erase_subject("alice")
        else:
            projections_stall_after_first_wait(kernel, behind)
            kernel.erase_capture("alice", target)
    request_id = unfinished_request(kernel, scope, [] if scope == "subject" else [target])
    assert request_id
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    argv = [backend.kind, backend.url or "", str(backend.data_dir), scope, target, str(barrier)]
    children = [PythonChild(_FINISHER, *argv, str(n)) for n in range(2)]
    try:
        deadline = time.monotonic() + 120
        while len(list(barrier.glob("ready-*"))) < 2:
            assert time.monotonic() < deadline, "the finishers did not start"
            if not all(c.poll() is None for c in children):
                # One died. What it said; the other waits for "go" and never ends on its
                # own (asking it for its output first, as before, waited for ever).
                for c in children:
                    c.kill()
                raise AssertionError([c.communicate() for c in children])
            time.sleep(0.01)
        (barrier / "go").touch()
        outcomes = []
        for child in children:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, err[-3000:]
            outcomes.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        # A failure above left the other finisher waiting for "go" (polling, with the
        # store open) after the test had ended.
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()

    receipts = [o["receipt"] for o in outcomes if "receipt" in o]
    assert receipts, outcomes
    for receipt in receipts:  # two finishers may each sign one: the same request's
        assert receipt["body"]["request"]["request_id"] == request_id
        assert receipt["body"]["actions"] == receipts[0]["body"]["actions"]
        verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    refused = {o["refused"] for o in outcomes if "refused" in o}
    allowed = {"SubjectErasedError"} if scope == "subject" else {"InvalidInputError"}
    assert refused <= allowed, outcomes
    ledger_file = kernel.settings.key_path / LEDGER_FILE
    lines = ledger_file.read_bytes().splitlines()
    assert all(json.loads(line) for line in lines)  # every line whole
    kinds = [json.loads(line)["kind"] for line in lines]
    assert 1 <= kinds.count("receipted") <= len(receipts)
    assert unfinished_request(kernel, scope, [] if scope == "subject" else [target]) is None
    kernel.audit_log.verify_integrity()
    if scope == "subject":
        assert rows_left(kernel, stream) == 0
    else:
        assert target not in capture_ids(kernel)


# ------------------------------------------------------------------ restore a backup


def _backup_then_incomplete_capture_erasure_then_restore(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Uprof, str, str]:
    """A backup, then a capture erasure that answered incomplete, then the backup
    restored (a rollback of the data: the log no longer holds the erasure's tombstone).
    Returns the restarted kernel, the capture id and the request id."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    consent(kernel)
    ack = kernel.capture("alice", say(f"I want to learn to {SAIL}", ref="sail"))
    kernel.capture("alice", say("I live in Porto", ref="porto"))
    kernel.process()
    kernel.close()
    backup(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_capture("alice", ack.capture_id)
    request_id = unfinished_request(kernel, "capture", [ack.capture_id])
    assert request_id
    kernel.close()
    report = restore(settings, tmp_path / "bk")
    assert report.ledger.stale_captures == 1 and report.ledger.rebuilt
    return build_kernel(settings, clock), ack.capture_id, request_id


def test_a_restore_after_an_incomplete_capture_erasure_brings_nothing_back(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, capture_id, _ = _backup_then_incomplete_capture_erasure_then_restore(
        backend, clock, tmp_path, monkeypatch
    )
    try:
        view = kernel.profile("alice")
        assert view.intents == ()
        assert [m.text for m in view.memories] == ["I live in Porto"]
        assert capture_id not in capture_ids(kernel)
        assert SAIL.lower() not in json.dumps(kernel.export_subject("alice"), default=str).lower()
        report = kernel.residue_scan([SAIL, SAIL.lower()])
        # Nothing readable; the erasure answered incomplete and nobody asked again: it is
        # open, and the audit says so (bug PS, decision 0198-residue-in-progress).
        erasures = [(f.kind, f.erasure) for f in report.findings]
        assert erasures == [("erasure", INTERRUPTED)], report.findings
    finally:
        kernel.close()


def _cited_tombstone(kernel: Uprof, body: dict[str, Any]) -> str:
    """The class of the event at the position the receipt cites as its tombstone."""
    (tombstone,) = [a for a in body["actions"] if a["type"] == "tombstone_appended"]
    position = int(tombstone["notification_id"])
    (cited,) = kernel.app.notifications_after(position - 1, 1)
    assert cited.id == position
    event = kernel.app.decode(cited)
    assert str(event.originator_id) == tombstone["stream"]
    return type(event).__name__


@pytest.mark.parametrize("later_writes", [0, 4])
def test_an_incomplete_erasure_rolled_back_by_a_restore_is_not_receipted_falsely(
    backend: Backend,
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    later_writes: int,
) -> None:
    """The restore rolls the log back below the erasure's tombstone. Before the fix,
    asking again answered "projections behind" (they were at the head) until later
    writes passed the old position, and then signed a receipt whose tombstone was
    another event (an InteractionCaptured)."""
    kernel, capture_id, request_id = _backup_then_incomplete_capture_erasure_then_restore(
        backend, clock, tmp_path, monkeypatch
    )
    try:
        for n in range(later_writes):  # take the log past the rolled-back tombstone
            kernel.capture("alice", say(f"I like tea number {n}", ref=f"tea-{n}"))
        kernel.process()

        result = kernel.erase_capture("alice", capture_id)

        body = result.receipt["body"]
        assert body["request"]["request_id"] == request_id
        verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
        assert _cited_tombstone(kernel, body) == "CaptureErased"
        assert unfinished_request(kernel, "capture", [capture_id]) is None
        view = kernel.profile("alice")
        assert view.intents == ()
        assert len(view.memories) == 1 + later_writes
        assert SAIL.lower() not in json.dumps(kernel.export_subject("alice"), default=str).lower()
    finally:
        kernel.close()


def _intent_backed_up(backend: Backend, clock: FakeClock, tmp_path: Path) -> tuple[Any, Uprof, Any]:
    """A subject with one intent, a backup taken of it, and a kernel opened again."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    intent = sail_intent_of_alice(kernel)
    kernel.close()
    backup(settings, tmp_path / "bk")
    return settings, build_kernel(settings, clock), intent


def test_an_incomplete_item_erasure_rolled_back_by_a_restore_is_finished_by_asking_again(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key is destroyed for an item, so the restore brings the item's events back
    without its erasure. The start re-applies the ledger's ``items`` record (the item is
    not served again), and asking again finishes the request, citing the tombstone the
    log holds now."""
    settings, kernel, intent = _intent_backed_up(backend, clock, tmp_path)
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_item("alice", intent.item_id)
    request_id = unfinished_request(kernel, "item", [intent.item_id])
    kernel.close()
    restore(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        assert kernel.profile("alice").intents == ()

        result = kernel.erase_item("alice", intent.item_id)

        body = result.receipt["body"]
        assert body["request"]["request_id"] == request_id
        verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
        assert _cited_tombstone(kernel, body) == "ItemsErased"
        assert kernel.profile("alice").intents == ()
        assert unfinished_request(kernel, "item", [intent.item_id]) is None
    finally:
        kernel.close()


def test_a_receipted_item_erasure_is_not_undone_by_a_restore(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings, kernel, intent = _intent_backed_up(backend, clock, tmp_path)
    kernel.erase_item("alice", intent.item_id)
    kernel.close()
    restore(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        assert intent.item_id not in [i.item_id for i in kernel.profile("alice").intents]
    finally:
        kernel.close()


def _backup_then_incomplete_subject_erasure_then_restore(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Uprof, str]:
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    fill(kernel, "alice", ALICE)
    fill(kernel, "bob", BOB)
    kernel.close()
    backup(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
    request_id = unfinished_subject_request(kernel, "alice")
    kernel.close()
    restore(settings, tmp_path / "bk")
    return build_kernel(settings, clock), request_id


def test_a_restore_after_an_incomplete_subject_erasure_brings_nothing_back(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, _ = _backup_then_incomplete_subject_erasure_then_restore(
        backend, clock, tmp_path, monkeypatch
    )
    try:
        # assert_erased_everywhere less erase_subject, which here finishes the erasure
        for read in (
            lambda: kernel.profile("alice"),
            lambda: kernel.export_subject("alice"),
            lambda: kernel.evidence("alice", "x"),
            lambda: kernel.capture("alice", say("hello again")),
        ):
            with pytest.raises(SubjectErasedError):
                read()
        report = kernel.residue_scan(list(ALICE.values()))
        # Nothing readable; the erasure answered incomplete and nobody asked again: it is
        # open, and the audit says so (bug PS, decision 0198-residue-in-progress).
        erasures = [(f.kind, f.erasure) for f in report.findings]
        assert erasures == [("erasure", INTERRUPTED)], report.findings
        assert_intact(kernel, "bob", BOB)
    finally:
        kernel.close()


def test_an_incomplete_subject_erasure_rolled_back_by_a_restore_is_not_receipted_falsely(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, request_id = _backup_then_incomplete_subject_erasure_then_restore(
        backend, clock, tmp_path, monkeypatch
    )
    try:
        kernel.capture_many("bob", [say(f"I like tea number {n}") for n in range(4)])
        kernel.process()
        try:
            result = kernel.erase_subject("alice")
        except ErasureIncompleteError as waiting:
            raise AssertionError("asked to ask again, with nothing left to wait for") from waiting
        except UprofError as refused:  # a stated refusal naming why is acceptable
            assert "restore" in str(refused), refused
            return
        body = result.receipt["body"]
        assert body["request"]["request_id"] == request_id
        assert _cited_tombstone(kernel, body) == "SubjectErased"
    finally:
        kernel.close()


# ------------------------------------------------------------ a draft of decision 0051


def _as_0051_draft(draft: dict[str, Any]) -> dict[str, Any]:
    """The subject draft as decision 0051's code (51e0314) wrote it: no scope, target or
    actions; the destroyed keys, purged rows and memories as their own fields."""
    actions = draft["actions"]
    return {
        "request_id": draft["request_id"],
        "received_at": draft["received_at"],
        "basis": draft["basis"],
        "pseudonym": draft["pseudonym"],
        "stream": draft["stream"],
        "tombstone_id": draft["tombstone_id"],
        "deks": [
            [a["key_version"], a["dek_commitment"]] for a in actions if a["type"] == "dek_destroyed"
        ],
        "rows": next(a["rows"] for a in actions if a["type"] == "projection_purged"),
        "memories": next(a["rows"] for a in actions if a["type"] == "embeddings_purged"),
        "counts": draft["counts"],
    }


def test_an_incomplete_subject_erasure_recorded_by_the_0051_code_is_finished(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision 0052 says a draft of 0051's code is read as a subject's; the deployment
    upgraded between the two must still finish it (before: TypeError on every ask)."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
    request_id = unfinished_subject_request(kernel, "alice")
    kernel.close()
    ledger_file = settings.key_path / LEDGER_FILE
    lines = []
    for line in ledger_file.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["kind"] == "incomplete":
            current = json.loads(record["draft"])
            record["draft"] = json.dumps(_as_0051_draft(current))
        elif record["kind"] == "subject":
            record.pop("draft", None)  # 0051's code wrote no draft with the record
        lines.append(json.dumps(record, separators=(",", ":"), sort_keys=True))
    ledger_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kernel = build_kernel(settings, clock)
    try:
        result = kernel.erase_subject("alice")

        body = result.receipt["body"]
        assert body["request"]["request_id"] == request_id
        assert body["request"]["scope"] == "subject"
        assert body["actions"] == current["actions"]
        verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
        assert rows_left(kernel, stream) == 0
        with pytest.raises(SubjectErasedError):
            kernel.erase_subject("alice")
    finally:
        kernel.close()


# -------------------------------------------------------- an item, then with evidence


def test_asking_with_evidence_after_an_incomplete_item_erasure_erases_the_evidence(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain item erasure answered incomplete; the caller then asks for the item with
    its evidence. Before the fix it finished the plain one (scope "item") and stopped
    there: the captured event stayed, and with the item gone its evidence could no longer
    be named."""
    consent(kernel)
    ack = kernel.capture("alice", say(f"I want to learn to {SAIL}"))
    (intent,) = kernel.profile("alice").intents
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_item("alice", intent.item_id)
    plain = unfinished_request(kernel, "item", [intent.item_id])

    result = kernel.erase_item("alice", intent.item_id, with_evidence=True)

    body = result.receipt["body"]
    assert body["request"]["scope"] == "item-with-evidence"
    assert body["request"]["request_id"] != plain
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert ack.capture_id not in capture_ids(kernel)
    assert kernel.profile("alice").intents == ()
    assert SAIL.lower() not in json.dumps(kernel.export_subject("alice"), default=str).lower()
    # The plain request, asked again, still gets its own receipt; then nothing is left.
    again = kernel.erase_item("alice", intent.item_id)
    assert again.receipt["body"]["request"]["request_id"] == plain
    assert unfinished_request(kernel, "item", [intent.item_id]) is None
