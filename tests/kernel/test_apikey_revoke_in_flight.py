"""A revocation asked for while another process's revocation of the same key is
between its commit and its audit entry (SQLite and PostgreSQL, real processes; decision
0127-review-of-0121, bug DL).

Bug CN's fix covered two processes that both read the key live. A second command that
starts after the first one's UPDATE committed, and before its ``apikey.revoked`` entry
(the append waits for the audit log's write lock, which every request's entry takes),
reads the key revoked and no entry: the path meant for a revocation a crash kept off the
log. It wrote the entry with ``reason_code`` recorded-late, said "revoked", and the
revoking process's own entry was left out by ``once_by``: the log told of a lost and
late-recorded revocation that had been recorded on time. The revocation now holds a lock
of the key store's (per deployment, released when its holder dies) from its read to its
entry, which the late path takes too: it waits for a live revoker and acts only for a
dead one. A revocation a crash really kept off the log is still recorded late, once,
however many processes ask again at once.
"""

from __future__ import annotations

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from tests.kernel.review121_child import revoke_once, revoke_then_hold
from tests.kernel.test_apikey_revoked_after_a_crash import revocations


def _issue(backend: Backend) -> str:
    setup = build_kernel(settings_for(backend), FakeClock())
    try:
        return setup.issue_api_key("app:x", ["app"]).info.key_id
    finally:
        setup.close()


def test_a_revocation_asked_while_another_is_recording_it_is_not_recorded_late(
    backend: Backend,
) -> None:
    settings = settings_for(backend)
    key_id = _issue(backend)
    ctx = children.CONTEXT
    sync, out = {"revoked": ctx.Event(), "go": ctx.Event()}, ctx.Queue()
    first = ctx.Process(target=revoke_then_hold, args=(settings, key_id, sync, out))
    first.start()
    assert sync["revoked"].wait(timeout=120)  # committed, its entry not yet appended
    second = ctx.Process(target=revoke_once, args=(settings, key_id, "second", None, out))
    second.start()
    second.join(3)  # on main it finished meanwhile; fixed, it waits for the first
    sync["go"].set()
    answers = dict(out.get(timeout=120) for _ in range(2))
    for p in (first, second):
        p.join(60)
        assert p.exitcode == 0
    kernel = build_kernel(settings, FakeClock())
    try:
        (entry,) = revocations(kernel)
        # Recorded by the process that revoked it, as it happened: not "recorded late".
        assert "reason_code" not in entry, entry
        assert answers == {"first": True, "second": False}, answers
    finally:
        kernel.close()


def test_a_revocation_lost_to_a_crash_is_recorded_late_once_by_two_retries_at_once(
    backend: Backend,
) -> None:
    settings = settings_for(backend)
    key_id = _issue(backend)
    ctx = children.CONTEXT
    sync, out = {"revoked": ctx.Event(), "go": ctx.Event()}, ctx.Queue()
    victim = ctx.Process(target=revoke_then_hold, args=(settings, key_id, sync, out))
    victim.start()
    assert sync["revoked"].wait(timeout=120)
    victim.kill()  # between the key store's commit and the entry
    victim.join(60)
    barrier = ctx.Barrier(2)
    retries = [
        ctx.Process(target=revoke_once, args=(settings, key_id, role, barrier, out))
        for role in ("a", "b")
    ]
    for p in retries:
        p.start()
    answers = dict(out.get(timeout=120) for _ in retries)
    for p in retries:
        p.join(60)
        assert p.exitcode == 0
    kernel = build_kernel(settings, FakeClock())
    try:
        (entry,) = revocations(kernel)
        assert entry["reason_code"] == "recorded-late", entry
        # One of the two recorded it; the other found it recorded ("no live key").
        assert sorted(answers.values()) == [False, True], answers
    finally:
        kernel.close()


def test_a_revocation_that_hangs_does_not_keep_another_key_usable(backend: Backend) -> None:
    # The revocation lock must not let one stuck ``revoke`` (a suspended terminal, a
    # hung connection) hold up the revocation of a leaked key: past its wait, the
    # other revocation goes on without the lock and records its own entry on time.
    settings = settings_for(backend)
    stuck_key, leaked_key = _issue(backend), _issue(backend)
    ctx = children.CONTEXT
    sync, out = {"revoked": ctx.Event(), "go": ctx.Event()}, ctx.Queue()
    stuck = ctx.Process(target=revoke_then_hold, args=(settings, stuck_key, sync, out, 300.0))
    stuck.start()
    try:
        assert sync["revoked"].wait(timeout=120)  # holds the lock, appending "forever"
        other = ctx.Process(
            target=revoke_once, args=(settings, leaked_key, "other", None, out, 0.2)
        )
        other.start()
        # Without a bound on the wait this never comes while the first is stuck.
        assert out.get(timeout=120) == ("other", True)
        other.join(60)
        assert other.exitcode == 0
    finally:
        sync["go"].set()
    assert out.get(timeout=120) == ("first", True)
    stuck.join(60)
    kernel = build_kernel(settings, FakeClock())
    try:
        entries = {e["api_key_id"]: e for e in revocations(kernel)}
        assert set(entries) == {stuck_key, leaked_key}
        assert all("reason_code" not in e for e in entries.values()), entries
    finally:
        kernel.close()
