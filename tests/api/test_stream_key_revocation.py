"""An audit export being streamed ends when its API key is revoked by another process.

The key was checked once, when the request came in: an export already streaming went on
to its last record after `uprof apps revoke` (found 2026-12-04 beside the policy case,
tests/kernel/test_audit_stream_revocation.py). The route now authenticates the key again
every `STREAM_RECHECK_RECORDS` records, through the server's row cache (KEY_CACHE_TTL_S).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.conftest import PLANNER
from uprof.api import ApiKeyStore
from uprof.api.deps import while_key_live
from uprof.api.errors import EdgeError
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.facade import STREAM_RECHECK_RECORDS
from uprof.settings import Settings


def test_a_key_revoked_elsewhere_ends_the_stream_at_the_next_check(
    keys: ApiKeyStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER, ["app", "operator"])
    assert keys.authenticate(issued.token) is not None  # the request's own check
    closed: list[bool] = []

    def records() -> Iterator[str]:
        try:
            for i in range(3 * STREAM_RECHECK_RECORDS):
                yield f"record {i}\n"
        finally:
            closed.append(True)  # the export's closing audit entry is written here

    stream = while_key_live(records(), keys, issued.token)
    sent = [next(stream) for _ in range(10)]
    elsewhere = ApiKeyStore.open(settings)  # `uprof apps revoke` in another process
    try:
        assert elsewhere.revoke(issued.info.key_id)
    finally:
        elsewhere.close()
    clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row is now too old

    with pytest.raises(EdgeError) as refused:
        sent.extend(stream)

    assert refused.value.status == 401
    assert len(sent) == STREAM_RECHECK_RECORDS
    assert closed == [True]


def test_a_live_key_streams_to_the_end(keys: ApiKeyStore) -> None:
    issued = keys.create(PLANNER, ["app", "operator"])
    records = [f"record {i}\n" for i in range(3 * STREAM_RECHECK_RECORDS)]
    assert list(while_key_live(records, keys, issued.token)) == records
