"""Bug KC: two *different* keyed erasing withdrawals (two subjects' requests) never wait
for each other. Decision 0158 hashed each key's turn onto one of 256 shared locks, so two
keys on one shard took turns: with the first held inside its erasure (a real process,
as a long erasure of a large subject is) the second, a stranger's, waited the full 10 s
and was refused 409 ``request_in_progress``. Now each key has a lock of its own
(decision 0159-turn-locks)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, running, say, settings_for
from tests.kernel.test_simultaneous_erasure_receipts import Held
from tests.kernel.turn_lock_child import count_under_lock
from uprof.settings import Settings

#: The shard count of decision 0158, kept here only to pick keys that collided there.
SHARDS_OF_0158 = 256


def withdrawal_of(subject: str, consent_id: str, key: str, kernel: Any) -> Any:
    """``call`` for ``Held``: ``subject``'s keyed withdrawal with erase, as the API runs it."""

    class Answer:
        receipt: Any = None

    def execute(token: str) -> tuple[dict[str, Any], int]:
        result = kernel.withdraw_consent(subject, consent_id, erase=True, request_token=token)
        return {"receipt": result.receipt if result is not None else None}, 200

    body = {"subject": subject, "consent_id": consent_id, "erase": True}
    outcome = kernel.idempotent(APP, key, "consent.withdraw", body, execute)
    answer = Answer()
    answer.receipt = outcome.response["receipt"]
    return answer


def colliding_keys(kernel: Any) -> tuple[str, str]:
    """Two different keys whose turns shared one of 0158's 256 locks."""
    store = kernel.idempotency
    seen: dict[int, str] = {}
    for i in range(10_000):
        key = f"withdraw-{i}"
        shard = int(store.token(APP, key)[:8], 16) % SHARDS_OF_0158
        if shard in seen:
            return seen[shard], key
        seen[shard] = key
    raise AssertionError("no two keys on one shard among 10,000")  # pigeonhole: unreachable


@pytest.fixture
def two_subjects(backend: Backend) -> tuple[Settings, dict[str, str], tuple[str, str]]:
    settings = settings_for(backend)
    with running(settings, FakeClock()) as setup:
        consent(setup, "alice")
        consent(setup, "bob")
    kernel = build_kernel(settings, FakeClock())
    try:
        consents = {s: kernel.profile(s).consents[0].consent_id for s in ("alice", "bob")}
        for subject in consents:
            kernel.capture(subject, say(f"{subject} wants to learn to sail"))
        kernel.process()
        keys = colliding_keys(kernel)
    finally:
        kernel.close()
    return settings, consents, keys


def test_a_strangers_withdrawal_is_not_held_up_by_another_key_on_its_old_shard(
    two_subjects: tuple[Settings, dict[str, str], tuple[str, str]],
) -> None:
    settings, consents, (alice_key, bob_key) = two_subjects
    alices = Held(
        settings,
        "before-capture-destroy",
        call=functools.partial(withdrawal_of, "alice", consents["alice"], alice_key),
    )
    bobs = Held(settings, call=functools.partial(withdrawal_of, "bob", consents["bob"], bob_key))
    alices.begin()  # alice's erasure is running (held), holding her key's turn
    kind_b, answer_b = bobs.answer()  # bob's own request, another key, another process
    kind_a, answer_a = alices.answer()
    assert kind_b == "ok" and answer_b is not None, answer_b
    assert kind_a == "ok" and answer_a is not None, answer_a
    assert answer_a != answer_b


#: Processes taking one lock at once, and how many times each takes it.
RACERS, ROUNDS = 4, 40


def test_a_named_lock_is_held_by_one_process_at_a_time_and_leaves_no_file(
    backend: Backend, tmp_path: Path
) -> None:
    """Each turn is a lock of its own, so its SQLite file is deleted by its holder (or the
    folder would grow by a file per key ever used); a process that waited on the deleted
    file must not hold it beside the next holder of the path (real processes)."""
    database = tmp_path / "locks.sqlite"
    url = backend.url if backend.kind == "postgres" else f"sqlite:///{database}"
    counter = tmp_path / "counter"
    counter.write_text("0")
    racers = [
        children.CONTEXT.Process(
            target=count_under_lock, args=(url, "idempotency-turn-x", str(counter), ROUNDS)
        )
        for _ in range(RACERS)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(300)
    assert [r.exitcode for r in racers] == [0] * RACERS
    assert int(counter.read_text()) == RACERS * ROUNDS  # no increment lost: one holder
    assert sorted(p.name for p in tmp_path.rglob("*") if "lock" in p.name) == (
        ["locks.sqlite.locks"] if backend.kind == "sqlite" else []
    )


def test_the_in_progress_wait_is_a_setting(backend: Backend) -> None:
    settings = settings_for(backend).model_copy(update={"request_in_progress_wait_s": 2.5})
    kernel = build_kernel(settings, FakeClock())
    try:
        assert kernel.idempotency is not None
        assert kernel.idempotency.in_progress_wait_s == 2.5
    finally:
        kernel.close()
