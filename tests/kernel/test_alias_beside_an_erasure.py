"""Binding a session id to a subject while another process erases that subject (SQLite
and PostgreSQL, real processes; decision 0127-review-of-0121, bug DK).

``register_session`` / ``register_identifier`` find the subject live, then store the
binding (since bug CM one upsert). An erasure in another process between the two
deleted the subject's aliases and index row; the binding stored after it pointed at the
erased stream: a keyed hash of the session id or identifier (an e-mail address) linked
to the shredded stream's id, left in the key store after the receipt said the
subject's aliases were destroyed, until the next process start re-applied the ledger
(and ``uprof residue`` reported it meanwhile). On PostgreSQL the same happened when
the binding was stored first and committed while the erasure ran (the erasure deleted
the aliases before the index row, and its alias DELETE did not see the uncommitted
binding). The binding is now stored only while the subject's index row is there, read
and locked in the same statement, and the erasure deletes the index row first.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.review121_child import bind_beside_an_erasure
from uprof.crypto.tables import subject_aliases, subject_index


def _orphan_aliases(engine: sa.Engine) -> int:
    live = sa.select(subject_index.c.stream_id)
    query = (
        sa.select(sa.func.count())
        .select_from(subject_aliases)
        .where(subject_aliases.c.stream_id.not_in(live))
    )
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


@pytest.mark.parametrize("hold", ["before", "after"])
def test_a_session_bound_while_another_process_erases_the_subject_leaves_no_alias(
    backend: Backend, hold: str
) -> None:
    settings = settings_for(backend)
    kernel = build_kernel(settings, FakeClock())
    try:
        consent(kernel, "alice")
        kernel.register_session("sess-old", "alice")
        ctx = children.CONTEXT
        sync, out = {"ready": ctx.Event(), "erased": ctx.Event()}, ctx.Queue()
        binder = ctx.Process(
            target=bind_beside_an_erasure,
            args=(settings, "alice", "sess-new", hold, sync, out),
        )
        binder.start()
        assert sync["ready"].wait(timeout=120)
        receipt = kernel.erase_subject("alice")
        sync["erased"].set()
        outcome = out.get(timeout=120)
        binder.join(60)
        assert binder.exitcode == 0
        assert receipt.receipt["body"]["subject"]
        # However the two met, no binding outlives the subject it names.
        assert _orphan_aliases(kernel.keys_engine) == 0, outcome
        if hold == "before":
            # Nothing bound, and the caller is told why (as if it had asked after the
            # erasure), never a storage error nor a false "registered".
            assert outcome[0] == "error" and outcome[1].startswith("SubjectErasedError"), outcome
        else:
            # Bound before the erasure took the subject's rows: it stood, then went with them.
            assert outcome == ("ok", ""), outcome
    finally:
        kernel.close()
