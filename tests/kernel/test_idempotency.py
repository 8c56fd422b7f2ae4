"""Idempotent writes (I14) at the kernel, on SQLite and PostgreSQL, across processes."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
import sqlalchemy as sa

from domain.errors import ConsentRequiredError, IdempotencyKeyReusedError, InvalidInputError
from domain.values import ProposalBatch
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, say, settings_for
from tests.kernel.idem_child import die_during, keyed_capture, race
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.services.idempotency import idempotency_keys

OTHER_APP = "app:calendar"


def captured(kernel: Uprof) -> list[str]:
    """Ids of every capture in the log (read from the log, not a view)."""
    notes = kernel.app.notifications_after(0, 100_000, [CAPTURED_TOPIC])
    return [kernel.app.decode(n).capture_id for n in notes]


def stored_rows(kernel: Uprof) -> list[Any]:
    with kernel.views_engine.connect() as conn:
        return list(conn.execute(sa.select(idempotency_keys)).all())


def test_replay_returns_the_first_answer_and_writes_once(kernel: Uprof) -> None:
    consent(kernel)
    first = keyed_capture(kernel, "key-1", "I like green tea")
    again = keyed_capture(kernel, "key-1", "I like green tea")
    assert not first.replayed and again.replayed
    assert again.response == first.response and again.status == first.status == 201
    assert captured(kernel) == [first.response["capture_id"]]


def test_same_key_other_body_is_refused_naming_the_header(kernel: Uprof) -> None:
    consent(kernel)
    keyed_capture(kernel, "key-1", "I like green tea")
    with pytest.raises(IdempotencyKeyReusedError, match="Idempotency-Key"):
        keyed_capture(kernel, "key-1", "I like black coffee")
    assert len(captured(kernel)) == 1


def test_keys_are_per_app(kernel: Uprof) -> None:
    consent(kernel)
    consent(kernel, app=OTHER_APP)
    a = keyed_capture(kernel, "shared-key", "I like green tea")
    b = keyed_capture(kernel, "shared-key", "I like green tea", app=OTHER_APP)
    assert not b.replayed
    assert b.response["capture_id"] != a.response["capture_id"]
    assert len(captured(kernel)) == 2


def test_a_refused_write_releases_its_key(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=OTHER_APP, categories=["*"], purposes=["x"])
    with pytest.raises(ConsentRequiredError):
        keyed_capture(kernel, "key-1", "I like green tea")
    assert stored_rows(kernel) == []
    consent(kernel)
    ok = keyed_capture(kernel, "key-1", "I like green tea")
    assert not ok.replayed and len(captured(kernel)) == 1


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "caf\u00e9"])
def test_malformed_keys_are_refused(kernel: Uprof, key: str) -> None:
    consent(kernel)
    with pytest.raises(InvalidInputError, match="Idempotency-Key"):
        keyed_capture(kernel, key, "I like green tea")
    assert captured(kernel) == []


def test_store_holds_no_plaintext(kernel: Uprof) -> None:
    consent(kernel)
    key = "order-alice@example.com-42"
    keyed_capture(kernel, key, "I like green tea canary-text")
    (row,) = stored_rows(kernel)
    flat = " ".join(str(v) for v in row)
    assert "alice" not in flat and "canary-text" not in flat and key not in flat
    # The stored answer holds ids only: capture id, log position, pseudonym.
    assert set(json.loads(row.response)) == {"capture_id", "notification_id", "subject_pseudonym"}


def test_keys_expire_and_are_purged(kernel: Uprof, clock: FakeClock) -> None:
    consent(kernel)
    first = keyed_capture(kernel, "key-1", "I like green tea")
    clock.advance(hours=23)
    assert keyed_capture(kernel, "key-1", "I like green tea").replayed
    clock.advance(hours=2)
    assert kernel.purge_idempotency_keys() == 1
    assert stored_rows(kernel) == []
    # Past the retention the key names a new request: the stream forgot it too.
    later = keyed_capture(kernel, "key-1", "I like green tea")
    assert not later.replayed and later.response["capture_id"] != first.response["capture_id"]
    assert len(captured(kernel)) == 2


def test_batch_consent_and_proposals_replay(kernel: Uprof) -> None:
    def once(key: str, op: str, body: dict[str, Any], write: Any) -> Any:
        return kernel.idempotent(APP, key, op, body, lambda t: (write(t), 201))

    def grant(t: str) -> dict[str, Any]:
        return {
            "consent_id": kernel.grant_consent(
                "alice", app_id=APP, categories=["*"], purposes=["personalization"], request_token=t
            )
        }

    g1 = once("g", "consent.grant", {"s": "alice"}, grant)
    g2 = once("g", "consent.grant", {"s": "alice"}, grant)
    assert g1.response == g2.response and g2.replayed
    assert len(kernel.profile("alice").consents) == 1

    def batch(t: str) -> dict[str, Any]:
        acks = kernel.capture_many(
            "alice", [say("I like tea"), say("I live in Lyon")], request_token=t
        )
        return {"acks": [asdict(a) for a in acks]}

    b1 = once("b", "capture.batch", {"n": 2}, batch)
    b2 = once("b", "capture.batch", {"n": 2}, batch)
    assert b1.response == b2.response and len(captured(kernel)) == 2

    proposals = ProposalBatch(
        proposals=(),
        author="agent:one",
        owner_agent="agent:one",
        sharing="shared",
        app_id=APP,
        purpose="personalization",
    )

    def propose(t: str) -> dict[str, Any]:
        return {"applied": kernel.submit_proposals("alice", proposals, request_token=t)}

    assert once("p", "proposals", {}, propose).response == {"applied": 0}
    assert once("p", "proposals", {}, propose).replayed

    consent_id = g1.response["consent_id"]

    def withdraw(t: str) -> dict[str, Any]:
        return {
            "erasure": kernel.withdraw_consent("alice", consent_id, request_token=t) is not None
        }

    once("w", "consent.withdraw", {"c": consent_id}, withdraw)
    assert once("w", "consent.withdraw", {"c": consent_id}, withdraw).replayed


def test_a_token_in_the_stream_stops_a_second_write_even_without_its_answer(
    kernel: Uprof,
) -> None:
    """The claim row lost its answer (crash after the write): the stream still knows."""
    consent(kernel)
    token = kernel.request_token(APP, "key-1")
    first = kernel.capture("alice", say("I like tea"), request_token=token)
    again = kernel.capture("alice", say("I like tea"), request_token=token)
    assert again == first
    assert captured(kernel) == [first.capture_id]


def test_forgotten_answers_replay_from_the_stream_and_write_nothing_twice(
    kernel: Uprof,
) -> None:
    """What a start does after rebuilding views that were ahead of their log
    (tests/kernel/test_torn_folder_copy.py): every stored answer goes, and a retry of a
    write the log holds is answered from the subject's stream, writing nothing."""
    consent(kernel)
    first = keyed_capture(kernel, "key-1", "I like green tea")
    keyed_capture(kernel, "key-2", "I like black coffee")
    assert kernel.idempotency is not None
    assert kernel.idempotency.forget_answers() == 2
    assert stored_rows(kernel) == []
    again = keyed_capture(kernel, "key-1", "I like green tea")
    assert again.response["capture_id"] == first.response["capture_id"]
    assert len(captured(kernel)) == 2


# ------------------------------------------------------------- processes


def _context() -> Any:
    return children.CONTEXT


def test_concurrent_duplicates_in_two_processes_write_once(backend: Backend) -> None:
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    try:
        consent(setup)
    finally:
        setup.close()
    ctx = _context()
    keys = [f"race-{i}" for i in range(8)]
    barrier, out = ctx.Barrier(2), ctx.Queue()
    racers = [ctx.Process(target=race, args=(settings, keys, barrier, out)) for _ in range(2)]
    for p in racers:
        p.start()
    answers: dict[str, list[Any]] = {}
    for _ in range(2 * len(keys)):
        key, response, status = out.get(timeout=120)
        answers.setdefault(key, []).append((response, status))
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    kernel = build_kernel(settings, FakeClock())
    try:
        ids = captured(kernel)
        assert len(ids) == len(keys)  # exactly one write per key
        for key in keys:
            (a, sa_), (b, sb) = answers[key]
            assert a == b and sa_ == sb == 201  # both callers got the same answer
        assert sorted(a[0][0]["capture_id"] for a in answers.values()) == sorted(ids)
    finally:
        kernel.close()


@pytest.mark.parametrize("kill", ["before-write", "after-write"])
def test_a_writer_killed_between_claim_and_answer_neither_blocks_nor_doubles(
    backend: Backend, kill: str
) -> None:
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    try:
        consent(setup)
    finally:
        setup.close()
    child = _context().Process(target=die_during, args=(settings, "key-1", kill))
    child.start()
    child.join(120)
    assert child.exitcode == -9
    kernel = build_kernel(settings, FakeClock())
    try:
        written_by_child = captured(kernel)
        assert len(written_by_child) == (1 if kill == "after-write" else 0)
        (row,) = stored_rows(kernel)
        assert row.state == "pending"  # claimed, never answered
        retry = keyed_capture(kernel, "key-1", "I like green tea")
        assert retry.status == 201
        ids = captured(kernel)
        assert len(ids) == 1
        assert retry.response["capture_id"] == ids[0]
        assert keyed_capture(kernel, "key-1", "I like green tea").response == retry.response
    finally:
        kernel.close()
