"""Review of 0223-review-of-0218-and-0219 by attack (0224-review-of-0220-and-0223), held:
an idempotent capture refused at the write because its key was revoked while it waited
for its subject's writer turn (bug UJ's roads: the request thread, group commit off; the
group writer's one-request fallback, group commit on), then retried with the same
``Idempotency-Key`` under a new key of the same app. The refusal must leave nothing
recorded under the idempotency key (no replayed 201 of a capture never written, no
request left "in progress"): the retry is written once, and a second retry replays it.
Live server on loopback, the key revoked by ``uprof apps revoke`` in its own process.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import (
    PLANNER,
    LiveServer,
    api_settings,
    bearer,
    build_kernel,
    grant,
    interaction,
    revoke_with_the_cli,
)
from tests.api.test_capture_key_at_the_write import TEXT, _captures_of_alice
from tests.api.test_capture_key_at_the_write_one_by_one import WAIT_S, _capture_after_its_turn
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.server import create_server

IDEMPOTENCY_KEY = "retry-after-revoke-1"


@pytest.mark.parametrize("group_commit", [False, True], ids=["request-thread", "writer-fallback"])
def test_held_an_idempotent_capture_refused_for_a_revoked_key_is_written_once_on_retry(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, group_commit: bool
) -> None:
    """Held: 401 at the write for the revoked key, nothing written; the same request with
    the same ``Idempotency-Key`` under a new key: 201, one capture; once more: the same
    capture replayed, still one."""
    from domain.errors import VersionConflictError

    settings = api_settings(backend, background=True).model_copy(
        update={"group_commit": group_commit}
    )
    kernel = build_kernel(settings)
    keys = ApiKeyStore.open(settings)
    try:
        with LiveServer(create_server(kernel, keys, max_body_bytes=64_000)) as live:
            writer = kernel.capture_service.writer
            assert writer.running is group_commit
            if group_commit:  # every group loses: each request goes the one-by-one road

                def loses(group: list[Any]) -> Any:
                    raise VersionConflictError("another process saved the subject first")

                monkeypatch.setattr(writer, "_write_group", loses)
            clock = [1000.0]
            monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
            issued = keys.create(PLANNER)
            with httpx.Client(base_url=live.url, timeout=WAIT_S) as http:
                grant(http, issued.token)
            before = _captures_of_alice(kernel)

            def revoked_elsewhere(http: httpx.Client) -> None:
                revoke_with_the_cli(settings, issued.info.key_id)
                clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
                refused = http.post(
                    "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
                )
                assert refused.status_code == 401, refused.text

            answer = _capture_after_its_turn(
                live,
                kernel,
                monkeypatch,
                issued.token,
                revoked_elsewhere,
                idempotency_key=IDEMPOTENCY_KEY,
            )
            assert answer.status_code == 401, answer.text
            assert _captures_of_alice(kernel) == before

            monkeypatch.undo()  # the writer turn no longer held; groups write again
            again = keys.create(PLANNER)
            headers = {**bearer(again.token), "Idempotency-Key": IDEMPOTENCY_KEY}
            body = {"subject": "alice", **interaction(TEXT)}
            with httpx.Client(base_url=live.url, timeout=WAIT_S) as http:
                retried = http.post("/v1/captures", headers=headers, json=body)
                assert retried.status_code == 201, retried.text
                assert _captures_of_alice(kernel) == before + 1
                replayed = http.post("/v1/captures", headers=headers, json=body)
                assert replayed.status_code in (200, 201), replayed.text
                assert replayed.json()["capture_id"] == retried.json()["capture_id"]
            assert _captures_of_alice(kernel) == before + 1
    finally:
        keys.close()
        kernel.close()
