"""An API key revocation whose ``apikey.revoked`` a crash kept off the log (both backends).

``uprof apps revoke`` commits the revocation in the key store, then appends
``apikey.revoked``. A process killed between the two (kill -9, the host going down) left
a key that no longer authenticates and a log that says it was issued and never taken
back; running the command again answered "no live key" and recorded nothing, so the log
could never learn of it. Now revoking again records it, ``reason_code`` recorded-late,
once however often it is asked; a key whose revocation the log holds writes nothing more.
"""

from __future__ import annotations

from typing import Any

from tests.conftest import Backend
from tests.kernel.other_process import run_in_another_process
from tests.kernel.test_erasure_resume import exported_trail_verifies
from uprof.apikeys.store import ApiKeyStore
from uprof.kernel import Uprof

LATE = "recorded-late"


def revocations(kernel: Uprof) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "apikey.revoked"]


def test_a_revocation_a_crash_kept_off_the_log_is_recorded_when_asked_again(
    backend: Backend, kernel: Uprof
) -> None:
    issued = kernel.issue_api_key("app:x", ["app"])
    key_id = issued.info.key_id
    died = run_in_another_process(
        backend,
        f"""
        kernel.audit.record = lambda *args, **kwargs: os._exit(9)  # after the commit
        kernel.audit.record_many = lambda *args, **kwargs: os._exit(9)
        kernel.revoke_api_key({key_id!r})
        """,
    )
    assert died.returncode == 9, died.stderr[-3000:]
    store = ApiKeyStore(kernel.keys_engine, tenant=kernel.subjects.tenant)
    assert store.authenticate(issued.token) is None  # revoked in the key store
    assert revocations(kernel) == []  # and not on the log (the defect)

    assert kernel.revoke_api_key(key_id) is True  # recorded now
    assert kernel.revoke_api_key(key_id) is False  # nothing more: no live key, on the log
    (entry,) = revocations(kernel)
    assert entry["reason_code"] == LATE
    assert entry["api_key_id"] == key_id and entry["app_id"] == "app:x"
    assert exported_trail_verifies(kernel)


def test_revoking_a_key_twice_records_one_revocation(kernel: Uprof) -> None:
    key_id = kernel.issue_api_key("app:x", ["app"]).info.key_id
    assert kernel.revoke_api_key(key_id) is True
    assert kernel.revoke_api_key(key_id) is False
    (entry,) = revocations(kernel)
    assert "reason_code" not in entry
    assert kernel.revoke_api_key("0123456789abcdef") is False  # no such key
    assert len(revocations(kernel)) == 1
