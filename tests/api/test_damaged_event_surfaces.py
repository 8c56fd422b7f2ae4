"""Review of 0119, held (BZ): a stored event damaged on disk, served by a real server.

The subject's consent event has one byte flipped in its tag (disk damage, a bad copy);
the server is started afresh on the damaged store, so nothing of the subject is cached.
A slice decodes the subject's stream (its consents): REST must answer 500
``stored_data_damaged`` with its hint, never the anonymous ``internal``, and neither the
answer nor the server's log may name the stream id or the content; the other subject is
served as before, and the subject can still be erased. Both backends.
"""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.api.conftest import (
    LOOPBACK_TLS,
    Apps,
    LiveServer,
    bearer,
    build_kernel,
    grant,
    interaction,
)
from tests.kernel.test_erasure_damaged_ciphertext import _flip_one_byte
from uprof.api import ApiKeyStore
from uprof.server import create_server
from uprof.settings import Settings

CANARY = "Qzxrestdamagedcanary"
SLICE = {
    "agent_id": "agent:one",
    "query": "market",
    "budget_tokens": 200,
    "purpose": "personalization",
}


def _serve(settings: Settings, keys: ApiKeyStore) -> tuple[object, LiveServer]:
    kernel = build_kernel(settings)
    return kernel, LiveServer(create_server(kernel, keys, max_body_bytes=64_000))


def test_a_damaged_event_is_a_named_500_without_stream_or_content(
    settings: Settings, keys: ApiKeyStore, apps: Apps, caplog: pytest.LogCaptureFixture
) -> None:
    kernel, live = _serve(settings, keys)
    try:
        with live, httpx.Client(base_url=live.url, timeout=30, verify=LOOPBACK_TLS) as http:
            for subject in ("alice", "bob"):
                grant(http, apps.planner, subject)
                r = http.post(
                    "/v1/captures",
                    headers=bearer(apps.planner),
                    json={"subject": subject, **interaction(f"I met {CANARY} at the market")},
                )
                assert r.status_code in (200, 201, 202), r.text
    finally:
        kernel.close()  # type: ignore[attr-defined]
    kernel = build_kernel(settings)
    try:
        kernel.process()
        stream = kernel.stream_of("alice")
        _flip_one_byte(kernel, stream, "ConsentGranted")
    finally:
        kernel.close()
    kernel, live = _serve(settings, keys)
    try:
        with (
            live,
            httpx.Client(base_url=live.url, timeout=30, verify=LOOPBACK_TLS) as http,
            caplog.at_level(logging.DEBUG),
        ):
            key = bearer(apps.planner)
            damaged = http.post("/v1/slices", headers=key, json={"subject": "alice", **SLICE})
            assert damaged.status_code == 500, damaged.text
            assert damaged.json()["error"]["code"] == "stored_data_damaged", damaged.text
            assert damaged.json()["error"]["hint"]
            for text in (damaged.text, caplog.text):
                assert str(stream) not in text and stream.hex not in text
                assert CANARY not in text
            other = http.post("/v1/slices", headers=key, json={"subject": "bob", **SLICE})
            assert other.status_code == 200, other.text
    finally:
        kernel.close()  # type: ignore[attr-defined]
