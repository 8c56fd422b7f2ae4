"""Attack review of decision 0152-erasure-leftovers (decision 0155-review-of-0152).

Bug JU: the history read (``profile(as_of=...)``) did not ask the ledger first, so an
item erasure killed after its ledger record (bug IP's window) stayed served there.
Bug JV: a history read at a time before an item erasure served the erased item, after
its receipt too: the replay skipped the erasure's ``ItemsErased`` as "later".
"""

from __future__ import annotations

import json
import signal
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from domain.errors import StoredDataDamagedError
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    APP,
    SAIL,
    build_kernel,
    consent,
    sail_intent_of_alice,
    say,
    settings_for,
)
from tests.kernel.test_damaged_event_quarantined import damage
from tests.kernel.test_erasure_leftovers import (
    ERASED,
    LINES,
    OTHER_HOST,
    SETTLE,
    _cli_env,
    _erase_on_other_host,
    _killed_after_record,
    _outcomes,
    assert_a_later_reimport_skips_the_erased_line,
    imported_with_consent,
)
from tests.kernel.test_import_idempotency import record
from tests.kernel.test_simultaneous_erasure_receipts import checked_offline
from uprof.crypto.keydir import SETTLE_HOST_LOCK_FILE
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore
from uprof.services.erasure import _Draft


def test_a_history_read_does_not_serve_an_item_whose_erasure_was_killed(
    backend: Backend, clock: FakeClock
) -> None:
    """JU: a real child SIGKILLed right after the item erasure's ledger record, beside a
    running process whose history read (as of tomorrow) must not list the item."""
    settings = settings_for(backend)
    running = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(running)
        _killed_after_record(settings, "item", intent.item_id)
        later = datetime.now(UTC) + timedelta(days=1)
        then = running.profile("alice", as_of=later)
        assert [i.item_id for i in then.intents] == [], then.intents
        assert running.profile("alice").intents == ()
    finally:
        running.close()


def _an_intent_beside_an_attribute(kernel: Uprof) -> None:
    """Alice, consenting, wants to learn to sail (her one intent, the item the tests
    erase) and lives in Porto (an attribute beside it); both processed."""
    consent(kernel)
    kernel.capture("alice", say(f"I want to learn to {SAIL}", ref="sail"))
    kernel.capture("alice", say("I live in Porto", ref="porto"))
    kernel.process()


def test_a_history_read_from_before_an_item_erasure_does_not_serve_the_item(
    backend: Backend, clock: FakeClock
) -> None:
    """JV: the item erasure completed (receipt issued); a history read at a time before
    it must not bring the erased item back."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        _an_intent_beside_an_attribute(kernel)
        view = kernel.profile("alice")
        (intent,) = view.intents
        kept = sorted(a.item_id for a in view.attributes)
        before = datetime.now(UTC)
        assert kernel.erase_item("alice", intent.item_id).receipt
        then = kernel.profile("alice", as_of=before)
        assert [i.item_id for i in then.intents] == [], then.intents
        # The rest of the history is still there.
        assert sorted(a.item_id for a in then.attributes) == kept
    finally:
        kernel.close()


# ------------------- IP: a read in another process while the item erasure is alive


def _erase_item_held(settings: Any, item_id: str, held: Any, go: Any, out: Any) -> None:
    """A child erasing an item, held (alive) right after its ledger record until ``go``."""
    kernel = build_kernel(settings, FakeClock())
    ledger = kernel.keystore.ledger
    assert ledger is not None
    real = ledger.record_items

    def recorded(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        held.set()
        assert go.wait(120)

    ledger.record_items = recorded  # type: ignore[method-assign]
    try:
        out.put(("ok", kernel.erase_item("alice", item_id).receipt))
    except Exception as error:  # the answer the caller would get
        out.put(("error", repr(error)))
    finally:
        kernel.close()


def test_a_read_beside_a_live_item_erasure_leaves_it_one_answer(backend: Backend) -> None:
    """Held (IP): process A's item erasure is alive between its ledger record and its
    ``ItemsErased``; process B (already running) serves a slice and the profile. B's
    read erases the item itself (so it is not served); A then finishes: one receipt,
    verifiable offline, one outcome on the log, no error, and the item stays gone."""
    settings = settings_for(backend)
    running = build_kernel(settings, FakeClock())
    ctx = children.CONTEXT
    try:
        intent = sail_intent_of_alice(running)
        held, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
        child = ctx.Process(target=_erase_item_held, args=(settings, intent.item_id, held, go, out))
        child.start()
        try:
            assert held.wait(120), "the erasure never reached its ledger record"
            served = running.slice(
                "alice",
                "learn",
                budget_tokens=500,
                purpose="personalization",
                app_id=APP,
                agent_id="agent:one",
            )
            assert intent.item_id not in json.dumps(asdict(served), default=str)
            assert running.profile("alice").intents == ()
        finally:
            go.set()
            kind, receipt = out.get(timeout=120)
            child.join(60)
        assert (kind, child.exitcode) == ("ok", 0), receipt
        checked_offline(settings, receipt)
        request = receipt["body"]["request"]["request_id"]
        naming = [
            e.entry["action"]
            for e in running.audit_log.entries()
            if e.entry.get("request_id") == request
        ]
        assert naming.count("projection.purged") == 1, naming
        running.process()
        assert running.profile("alice").intents == ()
    finally:
        running.close()


# ------------------------- IO: the sealed ref tokens once the subject is erased


def test_the_sealed_ref_tokens_die_with_the_subject(backend: Backend, clock: FakeClock) -> None:
    """Held (IO): a capture erasure seals its ref token into its ledger draft; once the
    subject is erased the residue scan finds neither the words, nor the ref, nor the
    token (data folder, databases, raw key folder bytes), and no draft opens any more."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        erased = imported_with_consent(kernel, LINES)["r-erased"]
        stream = str(kernel.stream_of("alice"))
        token = kernel.request_token(APP, "r-erased", namespace="source_ref")
        assert token
        kernel.erase_capture("alice", erased)
        ledger = kernel.keystore.ledger
        assert ledger is not None
        service = kernel.erasure_service
        drafts = [
            _Draft.from_json(r.draft)
            for r in ledger.drafts_of_stream(kernel.settings.tenant, stream)
        ]
        assert [t for d in drafts for t in service._unsealed_refs(d)] == [token]
        kernel.erase_subject("alice")
        clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
        kernel.purge_idempotency_keys()
        drafts = [
            _Draft.from_json(r.draft)
            for r in ledger.drafts_of_stream(kernel.settings.tenant, stream)
        ]
        assert drafts and [t for d in drafts for t in service._unsealed_refs(d)] == []
        report = kernel.residue_scan([ERASED, "r-erased", token])
        assert report.clean, report.findings
        key_dir = kernel.settings.key_dir
        assert key_dir is not None
        for path in key_dir.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
    finally:
        kernel.close()


def test_a_restored_item_with_evidence_erasure_still_skips_its_reimport(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held (IO, the other erasure kind that erases captures): an item erased with its
    evidence (receipted), a restore of a backup from before, a re-import after the
    idempotency retention: the erased capture does not come back."""
    lines = [record(f"I want to learn to {SAIL}", ref="r-sail"), record("I like tea", ref="r-kept")]
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        imported_with_consent(kernel, lines)
        (intent,) = kernel.profile("alice").intents
    finally:
        kernel.close()
    backup(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        assert kernel.erase_item("alice", intent.item_id, with_evidence=True).receipt
    finally:
        kernel.close()
    restore(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        assert_a_later_reimport_skips_the_erased_line(kernel, clock, lines)
        assert kernel.profile("alice").intents == ()
    finally:
        kernel.close()


# ----------------------------------------------- settle-host, run twice at once


def test_two_settle_host_runs_at_once_settle_each_request_once(backend: Backend) -> None:
    """Held (settle-host): requests dead on a host gone for good, two
    ``uprof erase settle-host`` processes at once: each request ends with exactly one
    outcome; the spellings of that host a mark does not carry (upper
    case, a trailing dot) settle nothing; the audit log still verifies."""
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    consent(setup)
    setup.close()
    ctx = children.CONTEXT
    for _ in range(3):
        dead = ctx.Process(target=_erase_on_other_host, args=(settings, None, None))
        dead.start()
        dead.join(120)
        assert dead.exitcode == -signal.SIGKILL
    env = _cli_env(settings)
    for spelling in (OTHER_HOST.upper(), OTHER_HOST + "."):
        done = children.run_python(SETTLE, "erase", "settle-host", spelling, "--yes", env=env)
        assert done.returncode == 0 and "settled 0" in " ".join(done.stdout.split()), done
    # Each later child's start, on that host, settled the one killed before it: the last
    # one is left open, for the operator.
    before = _outcomes(settings)
    still_open = [r for r, found in before.items() if not found]
    assert len(still_open) == 1, before
    assert all(f == [("erasure.abandoned", "process-ended")] for f in before.values() if f)
    runs = [
        children.PythonChild(SETTLE, "erase", "settle-host", OTHER_HOST, "--yes", env=env)
        for _ in range(2)
    ]
    answers = [(run.communicate(timeout=240), run.returncode) for run in runs]
    # They take turns (JW): neither takes the other's hold on a mark for the host's.
    assert all(code == 0 for _, code in answers), answers
    outcomes = _outcomes(settings)
    assert outcomes.keys() == before.keys()
    assert all(len(found) == 1 for found in outcomes.values()), outcomes
    assert [outcomes[r] for r in still_open] == [[("erasure.abandoned", "host-gone")]]
    kernel = build_kernel(settings, FakeClock())
    try:
        kernel.audit_log.verify_integrity()
    finally:
        kernel.close()


# --------------------- IP on a damaged stream: the read refuses, it serves no item


def test_a_killed_item_erasure_on_a_damaged_stream_is_not_served(
    backend: Backend, clock: FakeClock
) -> None:
    """Attacked (IP): one event of the subject's stream altered in storage, then an item
    erasure SIGKILLed after its ledger record. The running process cannot append the
    erasure (the stream fails authentication), so its reads of that subject answer the
    damage error rather than serve the item; before the kill, they were served."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        _an_intent_beside_an_attribute(kernel)
        (intent,) = kernel.profile("alice").intents
        damage(kernel, kernel.stream_of("alice"), 1)
        assert [i.item_id for i in kernel.profile("alice").intents] == [intent.item_id]
        _killed_after_record(settings, "item", intent.item_id)
        with pytest.raises(StoredDataDamagedError):
            kernel.profile("alice")
        with pytest.raises(StoredDataDamagedError):
            kernel.export_subject("alice")
    finally:
        kernel.close()


# ---------------- JW: a settle-host run in progress is not a live host's lock


def _settle_held(settings: Any, held: Any, go: Any, out: Any) -> None:
    """An operator's settle-host run (this host), held while it holds a mark of the host
    gone for good, just as it writes that request's ``erasure.abandoned``."""
    kernel = build_kernel(settings, FakeClock())
    service = kernel.erasure_service
    record = service._audit.record

    def recorded(action: str, **fields: Any) -> Any:
        if action == "erasure.abandoned":
            held.set()
            assert go.wait(120)
        return record(action, **fields)

    service._audit.record = recorded  # type: ignore[method-assign]
    try:
        done = kernel.settle_erasures_of_host(OTHER_HOST, requested_by="operator:first")
        out.put((done.settled, done.held))
    finally:
        kernel.close()


def test_a_settle_host_run_beside_another_is_not_told_the_host_is_alive(
    backend: Backend,
) -> None:
    """JW: a second ``uprof erase settle-host`` while the first holds a mark of the host
    gone for good. On main the second took the first's hold for the host's own and
    refused: "locked by a running process, so that host is not gone", exit 1, although
    the host was gone and the first run settled it. Settle-host runs take turns: the
    second waits for the first, then finds nothing left open (exit 0)."""
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    consent(setup)
    setup.close()
    ctx = children.CONTEXT
    dead = ctx.Process(target=_erase_on_other_host, args=(settings, None, None))
    dead.start()
    dead.join(120)
    assert dead.exitcode == -signal.SIGKILL
    held, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    first = ctx.Process(target=_settle_held, args=(settings, held, go, out))
    first.start()
    try:
        assert held.wait(120), "the first run never reached its request"
        second = children.PythonChild(
            SETTLE, "erase", "settle-host", OTHER_HOST, "--yes", env=_cli_env(settings)
        )
        # On main it answers at once; taking turns, it waits for the first run. Once it
        # is seen blocked on the turn's flock it can only wait: the first run goes on
        # then, not after the whole 20 s.
        turn = settings.key_path / SETTLE_HOST_LOCK_FILE
        children.until_ended_or_blocked_on(second, turn, 20)
    finally:
        go.set()
    settled, refused = out.get(timeout=120)
    first.join(60)
    assert (first.exitcode, len(settled), refused) == (0, 1, []), (settled, refused)
    stdout, stderr = second.communicate(timeout=240)
    assert second.returncode == 0, (stdout, stderr)
    assert "settled 0" in " ".join(stdout.split()), stdout
    assert list(_outcomes(settings).values()) == [[("erasure.abandoned", "host-gone")]]
