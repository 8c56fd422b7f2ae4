"""A subject's ``destroy`` reports the keys it deleted, not the keys it saw (review of
decision 0131, bug GK; SQLite and PostgreSQL).

Two erasures of one subject at once may both call ``destroy``: each receipt cites as its
own only the keys its destroy deleted, and the keys the other deleted ``by_request``
(bug GH). So a destroy that waits for another transaction deleting the same keys must
answer none: on PostgreSQL it read the keys, then its DELETE waited for the other's
commit and deleted nothing, and it still reported them.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from tests.kernel.conftest import consent, say
from uprof.crypto.tables import subject_keys
from uprof.kernel import Uprof


def test_a_destroy_waiting_for_another_deleting_the_keys_reports_none(kernel: Uprof) -> None:
    consent(kernel, "alice")
    kernel.capture("alice", say("I want to learn to sail"))
    handle = kernel.subjects.find("alice")
    assert handle is not None
    stream = str(handle.stream_id)
    engine = kernel.keystore._engine
    assert kernel.keystore.destruction_preview(stream).deks, "alice has no key to destroy"
    answers: list[object] = []
    with engine.connect() as other:
        other.begin()
        # Another erasure's destroy, its DELETE done, not yet committed.
        other.execute(subject_keys.delete().where(subject_keys.c.stream_id == stream))
        worker = threading.Thread(
            target=lambda: answers.append(
                kernel.keystore.destroy(stream, now=datetime(2026, 1, 1, tzinfo=UTC))
            )
        )
        worker.start()
        time.sleep(1.0)  # this destroy now waits for the other's lock
        other.commit()
    worker.join(60)
    assert not worker.is_alive()
    assert len(answers) == 1, answers
    (destruction,) = answers
    assert destruction.deks == (), destruction  # type: ignore[attr-defined]
    assert kernel.keystore.destruction_preview(stream).deks == ()
