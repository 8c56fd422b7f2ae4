"""A consent is granted or withdrawn only for a key that still stands when the change has
its subject's writer turn (SQLite and PostgreSQL, a live server, the key revoked by
``uprof apps revoke`` in a process of its own).

``POST /v1/consents`` and ``POST /v1/consents/withdraw`` (without ``erase``) are decided
when they arrive, then load, change and save the subject's stream in its writer turn
(``EventStore.with_retry``: another writer of the same subject saving first, a version
conflict's retries). The key was not asked again there: a key revoked while the change
waited still granted (201) or withdrew (200) the consent (bug TX, found in the pass over
the write routes after TW). ``POST /v1/proposals`` is decided again after its wait for the
views, then saves in the same turn: the same gap, the same fix (also TX).

The writer turns are the server process's locks: the test holds the subject's turn as
another writer would, revokes the key with the CLI in another process, lets the server's
read of the key row age past ``KEY_CACHE_TTL_S`` and sees the server refuse the key on
another request before it lets the change through.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, LiveServer, bearer, grant, interaction, revoke_with_the_cli
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

GRANT = {
    "subject": "alice",
    "categories": ["location"],
    "purposes": ["personalization"],
    "collected_by": "consent-ui:test",
}


class _Turn:
    """Every writer turn of the server's event store, held by the test as another writer
    of the subject holds its own: says when a writer arrives, lets it through once the
    test releases ``lock`` (a writer may enter its turn again inside it: the store's
    turns are re-entrant, so this one only waits for the release, it holds nothing)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived = threading.Event()

    def __enter__(self) -> None:
        self.arrived.set()
        with self.lock:
            pass

    def __exit__(self, *exc: object) -> None:
        return None


def _consents(kernel: Uprof) -> list[tuple[str, bool]]:
    """Alice's consents: (id, withdrawn), from her stream."""
    return [(c.consent_id, c.withdrawn_at is not None) for c in kernel.profile("alice").consents]


def _change_after_its_turn(
    server: LiveServer,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict[str, Any],
    token: str,
    meanwhile: Any,
) -> httpx.Response:
    """Post the consent change while the subject's writer turn is held; run
    ``meanwhile`` once it waits there; release; the change's answer."""
    turn = _Turn()
    stripes = len(kernel.app._writer_turns)
    monkeypatch.setattr(kernel.app, "_writer_turns", [turn] * stripes)
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        turn.lock.acquire()  # another writer of the subject is saving
        post = threading.Thread(
            target=lambda: answers.append(http.post(path, headers=bearer(token), json=body))
        )
        post.start()
        try:
            assert turn.arrived.wait(60), "the change never reached the subject's writer turn"
            meanwhile(http)
        finally:
            turn.lock.release()
        post.join(60)
    assert answers, "the change never answered"
    return answers[0]


def _setup(server: LiveServer, keys: ApiKeyStore) -> tuple[Any, str]:
    """A planner key of its own, and a consent it granted for alice (her stream)."""
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        consent_id = grant(http, issued.token)
    return issued, consent_id


@pytest.mark.parametrize("change", ["grant", "withdraw"])
def test_a_consent_change_that_waited_for_its_turn_is_refused_for_a_key_revoked_meanwhile(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    """Bug TX: the change reaches the subject's writer turn with a live key; another
    process revokes the key and the server already refuses it elsewhere; the change then
    gets its turn. Asked again with the key: 401, the consents as they were."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued, consent_id = _setup(server, keys)
    path, body = (
        ("/v1/consents", GRANT)
        if change == "grant"
        else ("/v1/consents/withdraw", {"subject": "alice", "consent_id": consent_id})
    )
    before = _consents(kernel)

    def revoked_elsewhere(http: httpx.Client) -> None:
        revoke_with_the_cli(settings, issued.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert refused.status_code == 401, refused.text  # revoked, as the server sees it

    answer = _change_after_its_turn(
        server, kernel, monkeypatch, path, body, issued.token, revoked_elsewhere
    )
    assert answer.status_code == 401, answer.text
    assert _consents(kernel) == before


@pytest.mark.parametrize("change", ["grant", "withdraw"])
def test_held_a_consent_change_with_a_live_key_is_written_after_its_turn(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    """The guard of TX's test: the same wait, the key standing: the change is written."""
    issued, consent_id = _setup(server, keys)
    path, body = (
        ("/v1/consents", GRANT)
        if change == "grant"
        else ("/v1/consents/withdraw", {"subject": "alice", "consent_id": consent_id})
    )

    def still_standing(http: httpx.Client) -> None:
        shown = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert shown.status_code == 200, shown.text

    answer = _change_after_its_turn(
        server, kernel, monkeypatch, path, body, issued.token, still_standing
    )
    assert answer.status_code in (200, 201), answer.text
    after = dict(_consents(kernel))
    if change == "grant":
        assert len(after) == 2
    else:
        assert after[consent_id] is True


def _proposal_setup(server: LiveServer, kernel: Uprof, keys: ApiKeyStore) -> tuple[Any, dict]:
    """A planner key of its own, a consent and a capture of alice's in the views; the
    body of a proposal citing the capture."""
    issued, _ = _setup(server, keys)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        captured = http.post(
            "/v1/captures",
            headers=bearer(issued.token),
            json={"subject": "alice", **interaction("I like green tea")},
        )
    assert captured.status_code == 201, captured.text
    assert kernel.wait_until_caught_up(30)  # extracted: no worker takes a turn later
    body = {
        "subject": "alice",
        "agent_id": "agent:one",
        "purpose": "personalization",
        "proposals": [
            {
                "kind": "memory",
                "text": "drinks Zq7 tea",
                "category": "preference",
                "evidence": [captured.json()["capture_id"]],
            }
        ],
    }
    return issued, body


def _proposed(kernel: Uprof) -> int:
    return sum(1 for m in kernel.profile("alice").memories if "Zq7" in m.text)


def test_a_proposal_that_waited_for_its_turn_is_refused_for_a_key_revoked_meanwhile(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug TX, the same write of the subject's stream: a proposal is decided again after
    its wait for the views (0111-review-of-0108-0109, AM), then saved in the subject's
    writer turn; a key revoked while it waited there wrote the memory. Now 401,
    nothing written."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued, body = _proposal_setup(server, kernel, keys)

    def revoked_elsewhere(http: httpx.Client) -> None:
        revoke_with_the_cli(settings, issued.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert refused.status_code == 401, refused.text  # revoked, as the server sees it

    answer = _change_after_its_turn(
        server, kernel, monkeypatch, "/v1/proposals", body, issued.token, revoked_elsewhere
    )
    assert answer.status_code == 401, answer.text
    assert kernel.wait_until_caught_up(30)
    assert _proposed(kernel) == 0


def test_held_a_proposal_with_a_live_key_is_written_after_its_turn(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard: the same wait, the key standing: the memory is written."""
    issued, body = _proposal_setup(server, kernel, keys)

    def still_standing(http: httpx.Client) -> None:
        shown = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert shown.status_code == 200, shown.text

    answer = _change_after_its_turn(
        server, kernel, monkeypatch, "/v1/proposals", body, issued.token, still_standing
    )
    assert answer.status_code in (200, 201), answer.text
    assert kernel.wait_until_caught_up(30)
    assert _proposed(kernel) == 1
