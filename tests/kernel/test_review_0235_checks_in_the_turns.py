"""Review of 0235-key-checks-around-the-locks (decision 0244-review-of-0235-to-0242):
the bound on checks left running counted every check under way, and 0235's checks in
the writer turns run side by side, one per subject's turn.

``MAX_CHECKS_LEFT_RUNNING`` (bug VY) bounds the threads a hung key store leaves behind:
"this many still running means the store has hung", since under the two write locks
checks are asked one at a time. 0235 (WI) asked a key check in every write's turn too,
before the store's lock: writes of different subjects (64 stripes) ask theirs at the
same time. The semaphore counted those as checks left running: the 17th write whose
check was under way while 16 others were, each answering well within its 2 s bound,
was refused at once, 503 "16 checks asked under a write lock are still waiting for the
store they read", nothing written. On SQLite and PostgreSQL, a kernel in this process
and 40 writers on threads, as a server's threads serve them."""

from __future__ import annotations

import threading

from domain.errors import CheckUnansweredError
from domain.principal import acting_credential
from domain.under_lock import MAX_CHECKS_LEFT_RUNNING
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, settings_for

WRITERS = 40
#: How long a check waits to see more than MAX_CHECKS_LEFT_RUNNING of them under way
#: before it answers anyway: well within the checks' own bound (2 s).
ANSWER_WITHIN_S = 1.0
WAIT_S = 120.0


def test_xm_many_writes_whose_key_checks_answer_within_the_bound_are_all_written(
    backend: Backend, clock: FakeClock
) -> None:
    kernel = build_kernel(settings_for(backend), clock)
    try:
        subjects = [f"subject-{n}" for n in range(WRITERS)]
        for subject in subjects:  # made first: the writes below go straight to the turn
            kernel.grant_consent(subject, app_id=APP, categories=["*"], purposes=["a"])
        guard = threading.Lock()
        under_way = [0, 0]  # now, most at once
        many = threading.Event()

        def key_check() -> None:
            """A key store that answers every read, each within ANSWER_WITHIN_S: as soon
            as more than MAX_CHECKS_LEFT_RUNNING reads are under way at once."""
            with guard:
                under_way[0] += 1
                under_way[1] = max(under_way[1], under_way[0])
                if under_way[0] > MAX_CHECKS_LEFT_RUNNING:
                    many.set()
            many.wait(ANSWER_WITHIN_S)
            with guard:
                under_way[0] -= 1

        refused: list[BaseException] = []
        start = threading.Barrier(WRITERS)

        def write(subject: str) -> None:
            acting_credential.set(key_check)  # this thread's context: the request's key
            start.wait(WAIT_S)
            try:
                kernel.grant_consent(subject, app_id=APP, categories=["*"], purposes=["b"])
            except CheckUnansweredError as error:
                refused.append(error)

        threads = [threading.Thread(target=write, args=(s,)) for s in subjects]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert not any(t.is_alive() for t in threads)
        assert refused == [], (
            f"{len(refused)} of {WRITERS} writes refused as an outage, their checks "
            f"answering within {ANSWER_WITHIN_S} s (at most {under_way[1]} under way at "
            f"once): {refused[0]}"
        )
        for subject in subjects:
            purposes = {p for c in kernel.profile(subject).consents for p in c.purposes}
            assert purposes == {"a", "b"}, subject
    finally:
        kernel.close()
