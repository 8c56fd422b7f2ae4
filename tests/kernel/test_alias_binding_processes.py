"""Binding a session id or an identifier from two processes at once (SQLite and
PostgreSQL, real processes; decision 0121-read-then-write-sweep, bug CM).

``SubjectKeyStore.bind_alias`` replaced a binding with a DELETE then an INSERT in one
transaction. On SQLite the DELETE takes the file's write lock, so a second binder waits
and then replaces the first one's row. On PostgreSQL (READ COMMITTED) a DELETE that finds
no row locks nothing: two processes binding the same new session id (a client's retry
landing on another server, a double submit) both deleted nothing, both inserted, and the
second failed on the primary key (a 500 for ``POST /v1/sessions``). Rebinding an existing
alias failed the same way: the second DELETE waited for the first's, found its row gone,
and did not see the row that replaced it. The binding is now one upsert.
"""

from __future__ import annotations

import pytest

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.sweep_child import bind_at_once
from uprof.services.subjects import IDENTIFIER, SESSION, SubjectRequest


def _race(backend: Backend, kind: str, alias: str, subjects: list[str]) -> list[tuple[str, str]]:
    settings = settings_for(backend)
    ctx = children.CONTEXT
    barrier, out = ctx.Barrier(len(subjects)), ctx.Queue()
    racers = [
        ctx.Process(target=bind_at_once, args=(settings, kind, alias, s, barrier, out))
        for s in subjects
    ]
    for p in racers:
        p.start()
    answers = [out.get(timeout=120) for _ in racers]
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    return answers


def _bound_to(backend: Backend, kind: str, alias: str) -> str:
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        request = (
            SubjectRequest(session_id=alias)
            if kind == SESSION
            else SubjectRequest(identifier=alias)
        )
        handle = kernel.subjects.resolve(request)
        for name in ("alice", "bob", "carol"):
            found = kernel.subjects.find(name)
            if found is not None and found.stream_id == handle.stream_id:
                return name
        raise AssertionError("bound to no subject of the test")
    finally:
        kernel.close()


@pytest.mark.parametrize("kind", [SESSION, IDENTIFIER])
def test_two_processes_binding_one_new_alias_at_once_both_succeed(
    backend: Backend, kind: str
) -> None:
    setup = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(setup, "alice")
    finally:
        setup.close()
    answers = _race(backend, kind, "sess-new", ["alice", "alice"])
    assert answers == [("ok", ""), ("ok", "")], answers
    assert _bound_to(backend, kind, "sess-new") == "alice"


def test_two_processes_rebinding_one_alias_at_once_both_succeed(backend: Backend) -> None:
    setup = build_kernel(settings_for(backend), FakeClock())
    try:
        for name in ("alice", "bob", "carol"):
            consent(setup, name)
        setup.register_session("sess-old", "carol")
    finally:
        setup.close()
    answers = _race(backend, SESSION, "sess-old", ["alice", "bob"])
    assert answers == [("ok", ""), ("ok", "")], answers
    # Rebinding replaces: the last binding stands, whichever process made it.
    assert _bound_to(backend, SESSION, "sess-old") in {"alice", "bob"}
