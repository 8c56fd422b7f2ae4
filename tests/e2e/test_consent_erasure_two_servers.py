"""TF's consent erasure turn (0216) across two ``uprof serve`` processes on one deployment
(real processes on loopback, SQLite and PostgreSQL; 0219-review-of-0216-and-tf): the same
withdrawal with ``erase``, without an ``Idempotency-Key`` (so no key's turn orders them),
sent to both servers at once, several times over. Held: one receipt per consent, both
answered 200 (the second with nothing left to erase), nothing collected left."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from audit.receipts import RECEIPT_ACTION
from benchmarks.server_ready import stop_server, wait_until_healthy
from tests.children import PythonChild, held_by_fixture, serving_child
from tests.conftest import Backend
from tests.e2e.test_store_damage_servers import APP
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, consented_settings, running
from uprof.settings import Settings

#: Consents withdrawn with erase at once from both servers, one after the other.
ROUNDS = 3


@pytest.fixture
def two_servers(backend: Backend, tmp_path: Path) -> Iterator[tuple[Settings, str, list[str]]]:
    """Two ``uprof serve`` processes on a deployment where alice granted ``APP`` a consent
    ``ROUNDS`` times over (the settings, the app's key, the two base URLs)."""
    from uprof.api import ApiKeyStore

    settings = consented_settings(backend)
    with running(settings, FakeClock()) as setup:
        for _ in range(ROUNDS - 1):
            consent(setup, "alice")
    keys = ApiKeyStore.open(settings)
    try:
        token = keys.create(APP).token
    finally:
        keys.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
    }
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    processes: list[PythonChild] = []
    urls: list[str] = []
    with contextlib.ExitStack() as held:
        try:
            for n in range(2):
                # Forked from the tests' fork server (the project imported once): each a
                # process of its own all the same; held past the test's body, stopped here.
                process, port = serving_child(
                    ["serve", "--log-level", "warning"], env, tmp_path / f"serve-{n}.stderr"
                )
                held.enter_context(held_by_fixture(process))
                processes.append(process)
                urls.append(f"http://127.0.0.1:{port}")
            for process, url in zip(processes, urls, strict=True):
                wait_until_healthy(process, url, timeout_s=120)
            yield settings, token, urls
        finally:
            for process in processes:
                stop_server(process)


def _post(url: str, token: str, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(
        f"{url}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=180
    )


def test_held_the_same_erasing_withdrawal_on_two_servers_at_once_gives_one_receipt(
    two_servers: tuple[Settings, str, list[str]],
) -> None:
    settings, token, urls = two_servers
    listed = _post(urls[0], token, "/v1/consents/list", {"subject": "alice"})
    assert listed.status_code == 200, listed.text
    consent_ids = [c["consent_id"] for c in listed.json()["consents"]]
    assert len(consent_ids) == ROUNDS, consent_ids
    kernel = build_kernel(settings, FakeClock())
    try:
        stream = str(kernel.stream_of("alice"))
        for n, consent_id in enumerate(consent_ids):
            # Something to erase in each round: a capture after the last round's erasure.
            captured = _post(urls[n % 2], token, "/v1/captures", _capture(n))
            assert captured.status_code in (200, 201, 202), captured.text
            assert kernel.wait_until_caught_up(120)
            assert kernel.queries.captures_by(stream, app_id=APP, purposes=("personalization",))
            sent = {"subject": "alice", "erase": True, "consent_id": consent_id}
            with ThreadPoolExecutor(2) as pool:
                pair = list(
                    pool.map(
                        lambda url, sent=sent: _post(url, token, "/v1/consents/withdraw", sent),
                        urls,
                    )
                )
            assert [a.status_code for a in pair] == [200, 200], [a.text for a in pair]
            receipts = [a.json()["erasure"] for a in pair if a.json()["erasure"] is not None]
            assert len(receipts) == 1, receipts  # the other found nothing left to erase
            assert kernel.wait_until_caught_up(120)
            kernel.reads.drain()
            logged = [e for e in kernel.audit_log.entries() if e.entry["action"] == RECEIPT_ACTION]
            assert len(logged) == n + 1, (n, len(logged))
            left = kernel.queries.captures_by(stream, app_id=APP, purposes=("personalization",))
            assert left == [], left
    finally:
        kernel.close()


def _capture(n: int) -> dict[str, object]:
    return {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": f"I like green tea, round {n}",
        "agent_response": "noted",
        "occurred_at": "2026-11-30T09:30:00Z",
        "session_id": f"s-{n}",
        "purpose": "personalization",
    }
