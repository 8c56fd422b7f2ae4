"""Two erasures of one subject at once, each interleaving forced (SQLite and PostgreSQL,
real processes; decision 0131-simultaneous-erasure-receipts).

``test_two_erasures_at_once.py`` lets two processes race from the same point and hits
these interleavings only now and then (3 and 4 of 20 runs failed on main, bugs EW and
EY); here each child stops at a chosen step (``simultaneous_erasure_child``) until the
test lets it go, so each interleaving happens on every run:

- EW: the later request appends its tombstone (0: the other's is there), then previews
  the keys after the other destroyed them: its receipt cited no key;
- EW, the other way round: the request whose tombstone it is previews after the other
  destroyed the keys: its receipt cited no key;
- EY: the later request reaches its tombstone after the other destroyed the keys: it
  was refused (``SubjectErasedError``) with its ``erasure.requested`` entry left without
  an outcome; an event erasure refused that way left the same.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
import sqlalchemy as sa

from audit.receipts import verify_receipt
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, consented_settings, say
from tests.kernel.simultaneous_erasure_child import erase_capture_of, erase_held
from tests.kernel.test_two_erasures_at_once import cited, outcomes_of_every_request
from uprof.settings import Settings

WAIT_S = 120


class Held:
    """A child erasing alice (or running ``call``), its kernel built. ``begin`` starts the
    erasure and waits until it stops at its first hold; ``next`` lets it go on to the
    next one; ``answer`` lets it finish and returns its answer."""

    def __init__(self, settings: Settings, *holds: str, call: Any = None) -> None:
        ctx = children.CONTEXT
        self.holds, self.at = holds, 0
        names = ["built", "begin"] + [f"{e}{i}" for i in range(len(holds)) for e in ("held", "go")]
        self.sync = {name: ctx.Event() for name in names}
        self.out = ctx.Queue()
        self.process = ctx.Process(
            target=erase_held, args=(settings, holds, self.sync, self.out, call)
        )
        self.process.start()
        assert self.sync["built"].wait(timeout=WAIT_S), "the child never built its kernel"

    def _reached(self) -> None:
        if self.at < len(self.holds):
            held = self.sync[f"held{self.at}"]
            deadline = time.monotonic() + WAIT_S
            while not held.wait(timeout=0.1):
                assert self.out.empty(), f"answered before {self.holds[self.at]}: {self.out.get()}"
                assert time.monotonic() < deadline, f"never reached {self.holds[self.at]}"

    def begin(self) -> Held:
        self.sync["begin"].set()
        self._reached()
        return self

    def next(self) -> Held:
        self.sync[f"go{self.at}"].set()
        self.at += 1
        self._reached()
        return self

    def kill(self) -> None:
        """Kill the child where it is held (SIGKILL: no cleanup, no audit write)."""
        self.process.kill()
        self.process.join(60)

    def answer(self) -> tuple[str, Any]:
        self.sync["begin"].set()
        for i in range(len(self.holds)):
            self.sync[f"go{i}"].set()
        answer = self.out.get(timeout=WAIT_S)
        self.process.join(60)
        assert self.process.exitcode == 0
        return answer  # type: ignore[no-any-return]


def request_of(receipt: dict[str, Any]) -> str:
    return str(receipt["body"]["request"]["request_id"])


def by_request(receipt: dict[str, Any], kind: str) -> list[str | None]:
    """``by_request`` of each action of this type (None where it names none)."""
    return [a.get("by_request") for a in receipt["body"]["actions"] if a["type"] == kind]


def checked_offline(settings: Settings, *receipts: dict[str, Any]) -> dict[str, Any]:
    """Verify each receipt as an auditor holding it and the public key alone; return the
    log's key.destroyed entries per (request, commitment) and every request's outcomes."""
    kernel = build_kernel(settings, FakeClock())
    try:
        for receipt in receipts:
            verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
        destroyed = sorted(
            (e.entry["request_id"], e.entry["dek_commitment"])
            for e in kernel.audit_log.entries(action="key.destroyed")
        )
        return {"destroyed": destroyed, "outcomes": outcomes_of_every_request(kernel)}
    finally:
        kernel.close()


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return consented_settings(backend)


def test_a_request_previewing_after_the_other_destroyed_the_keys_cites_that_destruction(
    settings: Settings,
) -> None:
    """EW: the later request's tombstone append finds the earlier one's tombstone (0);
    the earlier one then destroys the keys and finishes; the later one previews none."""
    later = Held(settings, "after-lookup", "after-tombstone")
    earlier = Held(settings, "before-destroy")
    later.begin()  # past its look for an unfinished erasure to finish, and its lookup
    earlier.begin()  # tombstone appended, ledger record written
    later.next()  # its tombstone append found the earlier one's (0)
    kind, first = earlier.answer()
    assert kind == "ok", first
    kind, second = later.answer()
    assert kind == "ok", second
    assert cited(first["body"]) == cited(second["body"])
    tombstones, keys = cited(first["body"])
    assert len(tombstones) == 1 and len(keys) == 1, first["body"]
    r1 = request_of(first)
    assert by_request(first, "tombstone_appended") == [None]
    assert by_request(first, "dek_destroyed") == [None]
    # The later receipt cites the earlier request's tombstone and key destruction,
    # naming that request.
    assert by_request(second, "tombstone_appended") == [r1]
    assert by_request(second, "dek_destroyed") == [r1]
    log = checked_offline(settings, first, second)
    (_, (_, commitment)) = tombstones, keys[0]
    assert log["destroyed"] == [(r1, commitment)], log  # the later request destroyed none
    assert len(log["outcomes"]) == 2 and all(log["outcomes"].values()), log


def test_the_tombstones_request_previewing_after_the_other_destroyed_the_keys_cites_it(
    settings: Settings,
) -> None:
    """EW the other way round: the request whose tombstone it is stops right after
    appending it; the other appends none (0), destroys the keys and finishes first."""
    tombstoner, destroyer = Held(settings, "after-tombstone"), Held(settings)
    tombstoner.begin()
    kind, second = destroyer.begin().answer()
    assert kind == "ok", second
    kind, first = tombstoner.answer()
    assert kind == "ok", first
    assert cited(first["body"]) == cited(second["body"])
    tombstones, keys = cited(first["body"])
    assert len(tombstones) == 1 and len(keys) == 1, first["body"]
    r1, r2 = request_of(first), request_of(second)
    assert by_request(first, "tombstone_appended") == [None]
    assert by_request(first, "dek_destroyed") == [r2]
    assert by_request(second, "tombstone_appended") == [r1]
    assert by_request(second, "dek_destroyed") == [None]
    log = checked_offline(settings, first, second)
    assert log["destroyed"] == [(r2, keys[0][1])], log
    assert len(log["outcomes"]) == 2 and all(log["outcomes"].values()), log


def test_a_request_reaching_its_tombstone_after_the_other_erasure_is_absorbed(
    settings: Settings,
) -> None:
    """EY: the later request has found the subject live; the other erases it entirely
    (keys destroyed, receipt issued) before the later one appends its tombstone."""
    later, other = Held(settings, "after-lookup"), Held(settings)
    later.begin()
    kind, first = other.begin().answer()
    assert kind == "ok", first
    kind, second = later.answer()
    assert kind == "ok", second  # on main: SubjectErasedError, and no outcome on the log
    r1 = request_of(first)
    assert cited(first["body"]) == cited(second["body"])
    assert by_request(second, "tombstone_appended") == [r1]
    assert by_request(second, "dek_destroyed") == [r1]
    log = checked_offline(settings, first, second)
    assert len(log["outcomes"]) == 2, log
    assert all(o == ["projection.purged"] for o in log["outcomes"].values()), log


def test_an_event_erasure_refused_because_the_subject_was_erased_meanwhile_says_so(
    settings: Settings,
) -> None:
    """EY, event erasure: its ``erasure.requested`` is on the log when another request
    erases the subject; it is refused (410) and the log records the refusal."""
    kernel = build_kernel(settings, FakeClock())
    try:
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
    finally:
        kernel.close()
    call = functools.partial(erase_capture_of, capture_id)
    event_erasure, other = Held(settings, "after-requested", call=call), Held(settings)
    event_erasure.begin()
    kind, receipt = other.begin().answer()
    assert kind == "ok", receipt
    kind, text = event_erasure.answer()
    assert kind == "error" and text.startswith("SubjectErasedError"), text
    after = build_kernel(settings, FakeClock())
    try:
        refused = [e.entry for e in after.audit_log.entries(action="erasure.refused")]
        outcomes = outcomes_of_every_request(after)
    finally:
        after.close()
    assert len(outcomes) == 2 and all(outcomes.values()), outcomes
    assert [(e["reason_code"], e["request_id"] in outcomes) for e in refused] == [
        ("SubjectErasedError", True)
    ], refused


def test_a_request_whose_keys_the_absorbed_one_destroyed_first_does_not_claim_them(
    settings: Settings,
) -> None:
    """GH: the tombstone's request previews the key and writes its ledger record, then
    stops before destroying it; the other request, absorbed on that tombstone, previews
    the key too (still there), destroys it and finishes. The first one's destroy then
    finds nothing: its receipt must cite the key as the other request's destruction,
    not as its own, and the log must hold one ``key.destroyed`` entry for it (the other
    request's), not one under each request."""
    other, earlier = Held(settings, "after-lookup"), Held(settings, "before-destroy")
    other.begin()  # past its look for an unfinished erasure to finish, and its lookup
    earlier.begin()  # tombstone appended, key previewed, ledger record written
    kind, second = other.answer()  # absorbed; previews the key, destroys it itself
    assert kind == "ok", second
    kind, first = earlier.answer()
    assert kind == "ok", first
    assert cited(first["body"]) == cited(second["body"])
    tombstones, keys = cited(first["body"])
    assert len(tombstones) == 1 and len(keys) == 1, first["body"]
    r1, r2 = request_of(first), request_of(second)
    assert by_request(second, "tombstone_appended") == [r1]
    assert by_request(second, "dek_destroyed") == [None]  # it did destroy the key
    assert by_request(first, "tombstone_appended") == [None]
    assert by_request(first, "dek_destroyed") == [r2]  # on main: [None], a second claimant
    log = checked_offline(settings, first, second)
    assert log["destroyed"] == [(r2, keys[0][1])], log
    assert len(log["outcomes"]) == 2 and all(log["outcomes"].values()), log


def test_an_event_erasure_whose_capture_key_a_subject_erasure_destroyed_cites_it(
    settings: Settings,
) -> None:
    """GI: an event erasure has appended its ``CaptureErased`` event; a subject erasure
    of the same subject then destroys every key (the capture's with the subject's) and
    finishes. The event erasure finds no capture key left: its receipt must still cite
    a key destruction (the subject's keys, by the subject erasure's request), not a
    tombstone alone, and the log must hold that destruction under that request."""
    kernel = build_kernel(settings, FakeClock())
    try:
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
    finally:
        kernel.close()
    call = functools.partial(erase_capture_of, capture_id)
    event_erasure = Held(settings, "before-capture-preview", call=call)
    subject_erasure = Held(settings)
    event_erasure.begin()  # its CaptureErased appended, no key looked for yet
    kind, first = subject_erasure.begin().answer()
    assert kind == "ok", first
    kind, second = event_erasure.answer()
    assert kind == "ok", second
    r1 = request_of(first)
    _, keys = cited(first["body"])
    assert len(keys) == 1, first["body"]
    assert by_request(first, "dek_destroyed") == [None]
    # on main: [], a receipt citing no key destruction at all
    assert by_request(second, "dek_destroyed") == [r1], second["body"]
    assert cited(second["body"])[1] == keys
    log = checked_offline(settings, first, second)
    assert log["destroyed"] == [(r1, keys[0][1])], log
    assert len(log["outcomes"]) == 2 and all(log["outcomes"].values()), log


def test_an_erasure_absorbed_after_the_name_was_re_created_leaves_the_new_subject_live(
    settings: Settings,
) -> None:
    """Review of 0131 (held): a request has found alice live (her first stream); the
    other request erases her entirely, and the operator re-creates the name (a new
    stream, consent, a capture) before the first request goes on. Absorbed on the first
    stream's tombstone, its ledger record (after the re-creation) must not make the new
    alice unreachable: she stays capturable, and a later erasure erases her new stream
    with its own tombstone, after a fresh start re-applied the ledger."""
    later, other = Held(settings, "after-lookup"), Held(settings)
    later.begin()
    kind, first = other.begin().answer()
    assert kind == "ok", first
    kernel = build_kernel(settings, FakeClock())
    try:
        kernel.recreate_subject("alice")
        consent(kernel, "alice")
        kernel.capture("alice", say("I moved to Lisbon"))
    finally:
        kernel.close()
    kind, second = later.answer()
    assert kind == "ok", second
    assert cited(first["body"]) == cited(second["body"])
    after = build_kernel(settings, FakeClock())
    try:
        after.capture("alice", say("I want to learn to sail"))
        third = after.erase_subject("alice")
    finally:
        after.close()
    assert cited(third.receipt["body"])[0] != cited(first["body"])[0]  # the new stream's
    assert by_request(third.receipt, "tombstone_appended") == [None]


def test_of_three_erasures_at_once_the_two_that_destroyed_nothing_cite_the_one_that_did(
    settings: Settings,
) -> None:
    """GL: three erasures of alice at once, each previewing the key before any destroys
    it; the ledger records come in the order C, A, B (A's tombstone, C and B absorbed),
    and A's destroy deletes the key. B and C must both cite A's destruction, and the log
    must hold that key's ``key.destroyed`` under A alone: citing the first other record
    (C, which destroyed nothing) made B write one under C."""
    b = Held(settings, "after-lookup", "before-destroy")
    c = Held(settings, "after-lookup", "before-destroy")
    a = Held(settings, "after-tombstone", "before-destroy")
    b.begin()
    c.begin()
    a.begin()  # A's tombstone appended
    c.next()  # C: absorbed, key previewed, ledger record (first)
    a.next()  # A: key previewed, ledger record (second)
    b.next()  # B: absorbed, key previewed, ledger record (third)
    kind, first = a.answer()  # A's destroy deletes the key
    assert kind == "ok", first
    kind, third = c.answer()
    assert kind == "ok", third
    kind, second = b.answer()
    assert kind == "ok", second
    r_a = request_of(first)
    _, keys = cited(first["body"])
    assert len(keys) == 1, first["body"]
    assert by_request(first, "dek_destroyed") == [None]
    assert by_request(third, "dek_destroyed") == [r_a]
    assert by_request(second, "dek_destroyed") == [r_a]  # before the fix: C's id
    log = checked_offline(settings, first, second, third)
    assert log["destroyed"] == [(r_a, keys[0][1])], log
    assert len(log["outcomes"]) == 3 and all(log["outcomes"].values()), log


def test_of_three_erasures_at_once_a_dead_destroyer_is_still_the_one_cited(
    settings: Settings,
) -> None:
    """GW: as GL, three erasures of alice at once (ledger records C, A, B; A's tombstone),
    but A is killed (SIGKILL) right after its destroy deleted the key, before its
    ``key.destroyed`` entry. B and C must both cite A, the request that deleted the key
    (the key store keeps who did, in the destroy's own transaction), and the log must
    hold that key's ``key.destroyed`` under A alone. Before the fix B cited C (GL's
    fallback: the first other ledger record, no ``key.destroyed`` on the log yet)."""
    b = Held(settings, "after-lookup", "before-destroy")
    c = Held(settings, "after-lookup", "before-destroy")
    a = Held(settings, "after-tombstone", "before-destroy", "after-destroy")
    b.begin()
    c.begin()
    a.begin()  # A's tombstone appended
    c.next()  # C: absorbed, key previewed, ledger record (first)
    a.next()  # A: key previewed, ledger record (second)
    b.next()  # B: absorbed, key previewed, ledger record (third)
    a.next()  # A's destroy deleted the key (committed)
    a.kill()  # before its key.destroyed entry
    kind, second = b.answer()  # B first: no key.destroyed entry on the log yet
    assert kind == "ok", second
    kind, third = c.answer()
    assert kind == "ok", third
    r_a = third["body"]["actions"][0].get("by_request")
    assert r_a and r_a not in (request_of(second), request_of(third)), third["body"]
    _, keys = cited(third["body"])
    assert len(keys) == 1, third["body"]
    assert by_request(third, "dek_destroyed") == [r_a]
    assert by_request(second, "dek_destroyed") == [r_a], second["body"]  # main: C's id
    assert cited(second["body"]) == cited(third["body"])
    log = checked_offline(settings, second, third)
    assert log["destroyed"] == [(r_a, keys[0][1])], log


def test_a_key_store_of_the_previous_release_is_migrated_and_attributes_exactly(
    settings: Settings,
) -> None:
    """Attack on GW's fix: a live deployment's key store written by the previous release
    (revision 0005, no ``destroyed_keys``) is opened by this release. The open migrates
    it (an additive table, no row rewritten), an erasure then records its destroy there,
    and its receipt still verifies offline."""
    from alembic import command
    from alembic.config import Config

    from uprof.storage import MIGRATIONS_DIR

    old = build_kernel(settings, FakeClock())
    try:
        engine = old.keystore._engine
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["branch"] = "keys"
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0005_keys_plain_row_keys")
        tables = set(sa.inspect(engine).get_table_names())
        assert not {"destroyed_keys", "destroyed_capture_keys"} & tables
    finally:
        old.close()
    kernel = build_kernel(settings, FakeClock())
    try:
        tables = sa.inspect(kernel.keystore._engine).get_table_names()
        assert {"destroyed_keys", "destroyed_capture_keys"} <= set(tables)
        stream = str(kernel.subjects.find("alice").stream_id)
        receipt = kernel.erase_subject("alice").receipt
        (version, commitment), *_ = cited(receipt["body"])[1]
        assert kernel.keystore.destroyed_by(stream) == {version: (request_of(receipt), commitment)}
    finally:
        kernel.close()
    checked_offline(settings, receipt)


def test_keys_destroyed_by_older_code_fall_back_to_the_ledger(settings: Settings) -> None:
    """Attack on GW's fix: during a rolling upgrade a process still running the older
    code destroys the key and records nobody (as a destroy with no request does). The
    other two requests then cite the destroyer from the ledger and the log (GL's
    fallback), never a request that deleted nothing, and the log holds one entry."""
    b = Held(settings, "after-lookup", "before-destroy")
    c = Held(settings, "after-lookup", "before-destroy")
    a = Held(settings, "after-tombstone", "before-destroy", "after-destroy")
    b.begin()
    c.begin()
    a.begin()
    c.next()
    a.next()
    b.next()
    a.next()  # A's destroy deleted the key
    kernel = build_kernel(settings, FakeClock())
    try:  # what the older code leaves: no row naming the destroyer
        with kernel.keystore._engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM destroyed_keys"))
    finally:
        kernel.close()
    kind, first = a.answer()  # A writes its key.destroyed entry and finishes
    assert kind == "ok", first
    kind, second = b.answer()
    assert kind == "ok", second
    kind, third = c.answer()
    assert kind == "ok", third
    r_a = request_of(first)
    assert by_request(second, "dek_destroyed") == [r_a]
    assert by_request(third, "dek_destroyed") == [r_a]
    log = checked_offline(settings, first, second, third)
    assert log["destroyed"] == [(r_a, cited(first["body"])[1][0][1])], log


def _event_and_subject_erasures(settings: Settings) -> tuple[Held, Held, str]:
    kernel = build_kernel(settings, FakeClock())
    try:
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
    finally:
        kernel.close()
    call = functools.partial(erase_capture_of, capture_id)
    event_erasure = Held(settings, "before-capture-destroy", call=call)
    subject_erasure = Held(settings)  # built now: its start re-applies no record of E
    event_erasure.begin()  # E: capture key previewed, ledger record written
    return event_erasure, subject_erasure, capture_id


def test_an_event_erasure_whose_previewed_capture_key_a_subject_erasure_destroyed_cites_it(
    settings: Settings,
) -> None:
    """GZ: an event erasure E has previewed its capture key and written its ledger record;
    a subject erasure S then destroys every key (the capture's with the subject's) and
    finishes. E's destroy finds the capture key gone: E must cite S's destruction
    (``by_request``), not claim the capture key from its preview, and the log must hold
    no ``key.destroyed`` under E for a key S deleted."""
    e, s, _ = _event_and_subject_erasures(settings)
    kind, first = s.begin().answer()
    assert kind == "ok", first
    kind, second = e.answer()
    assert kind == "ok", second
    r_s = request_of(first)
    assert by_request(second, "dek_destroyed") == [r_s], second["body"]  # main: [None]
    assert cited(second["body"])[1] == cited(first["body"])[1]
    log = checked_offline(settings, first, second)
    assert [r for r, _ in log["destroyed"]] == [r_s], log


def test_an_event_erasure_killed_after_its_ledger_record_and_retried_cites_the_subject_erasure(
    settings: Settings,
) -> None:
    """An event erasure E killed (SIGKILL) after its ledger record, before destroying its
    capture key; a subject erasure S of the same subject then destroys every key and
    finishes; the caller asks E again. The retry finishes E's request (its receipt, its
    outcome), citing S's destruction ``by_request``, never the capture key as E's own.
    On main the retry was refused (the subject is gone) and E never ended."""
    e, s, capture_id = _event_and_subject_erasures(settings)
    e.kill()
    kind, first = s.begin().answer()
    assert kind == "ok", first
    kernel = build_kernel(settings, FakeClock())
    try:
        second = kernel.erase_capture("alice", capture_id).receipt  # main: SubjectNotFound
    finally:
        kernel.close()
    r_s = request_of(first)
    assert by_request(second, "dek_destroyed") == [r_s], second["body"]
    assert cited(second["body"])[1] == cited(first["body"])[1]
    log = checked_offline(settings, first, second)
    assert [r for r, _ in log["destroyed"]] == [r_s], log
    assert len(log["outcomes"]) == 2 and all(log["outcomes"].values()), log
