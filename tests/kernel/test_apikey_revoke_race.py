"""Two processes revoking one API key at once (SQLite and PostgreSQL, real processes;
decision 0121-read-then-write-sweep, bug CN).

``revoke_api_key`` reads whether the key is live, revokes it with a conditional UPDATE
(``revoked_at IS NULL``), and appends ``apikey.revoked`` once (``once_by`` the key id).
The revocation and its entry were already once across processes. But the process whose
UPDATE matched nothing took the path meant for a revocation a crash kept off the log: it
found no entry yet (the revoking process had committed and not appended), so it wrote one
itself with ``reason_code`` recorded-late, and the revoking process's own entry was then
left out as a duplicate. The log told an auditor that the revocation had been lost by a
crash and recorded later, of a revocation recorded as it happened; and both commands said
they had revoked the key. A process that saw the key live and then lost the UPDATE did not
revoke it: it now answers False and writes nothing; the process that revoked writes the
entry. A revocation whose entry a crash kept off the log is still recorded late by the next
call, which finds the key revoked from the start
(tests/kernel/test_apikey_revoked_after_a_crash.py).
"""

from __future__ import annotations

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from tests.kernel.sweep_child import revoke_in_step
from tests.kernel.test_apikey_revoked_after_a_crash import revocations
from uprof.apikeys.store import ApiKeyStore


def test_two_processes_revoking_one_key_record_the_revocation_as_it_happened(
    backend: Backend,
) -> None:
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    try:
        issued = setup.issue_api_key("app:x", ["app"])
    finally:
        setup.close()
    ctx = children.CONTEXT
    sync = {
        "first_read": ctx.Event(),
        "second_read": ctx.Event(),
        "second_locked_out": ctx.Event(),
        "first_revoked": ctx.Event(),
        "second_done": ctx.Event(),
    }
    out = ctx.Queue()
    racers = [
        ctx.Process(target=revoke_in_step, args=(settings, issued.info.key_id, role, sync, out))
        for role in ("first", "second")
    ]
    for p in racers:
        p.start()
    answers = dict(out.get(timeout=120) for _ in racers)
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    kernel = build_kernel(settings, FakeClock())
    try:
        assert ApiKeyStore(kernel.keys_engine).authenticate(issued.token) is None
        (entry,) = revocations(kernel)  # once, as before
        assert entry["api_key_id"] == issued.info.key_id
        # Recorded by the process that revoked it, as it happened: not "recorded late".
        assert "reason_code" not in entry, entry
        assert answers == {"first": True, "second": False}, answers
    finally:
        kernel.close()
