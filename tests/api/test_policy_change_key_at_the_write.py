"""A REST policy change is written only for a key that still stands when the change has
its turn (SQLite and PostgreSQL, a live server, the key revoked by ``uprof apps revoke``
in a process of its own).

0211-console-and-center-finish (bug SN) asks a policy change's decision again behind
``PolicyService``'s write lock, before each attempt stages the change; the console's door
carries its key's check there, REST's did not: ``uprof/api/routes/policy.py`` built its
door without ``still_authenticated``, so a change that waited for its turn (another change
of the server saving; a conflict with another process's change, retried) asked the policy
again and not the key, and a key revoked meanwhile still wrote the change and its
``policy.changed`` entry, 200 (bug TU).

The write lock is a lock of the server process (another process's change shows as a
conflict, retried behind it, and asked again there): the test holds it as another change
would, then revokes the key with the CLI in another process and lets the server's read of
the key row age past ``KEY_CACHE_TTL_S`` (as the server's own clock would) and sees the
server refuse the key on another request before it lets the change through.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests.api.conftest import CALENDAR, PLANNER, LiveServer, bearer, revoke_with_the_cli
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

#: A role assignment the seed policy does not hold (app:calendar is role:scheduler).
ASSIGNMENT = {"app_id": CALENDAR, "role": "role:assistant"}

#: Each REST policy change with a body it accepts (``revoke`` after ASSIGNMENT is granted).
CHANGES: dict[str, dict[str, Any]] = {
    "grant": ASSIGNMENT,
    "revoke": ASSIGNMENT,
    "onboard": {"app_id": CALENDAR, "read": ["location"], "purpose": "personalization"},
}


class _Turn:
    """The policy service's write lock, held by the test as another change saving holds
    it: says when a change arrives at it, lets it through when the test releases it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived = threading.Event()

    def __enter__(self) -> None:
        self.arrived.set()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _policy_changes(kernel: Uprof) -> tuple[int, int]:
    """The policy's recorded changes and ``policy.changed`` entries, to compare."""
    kernel.reads.drain()
    entries = sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "policy.changed")
    return len(kernel.policy_history()), entries


def _change_after_its_turn(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
    token: str,
    meanwhile: Any,
) -> httpx.Response:
    """Post the change while the write lock is held; run ``meanwhile`` once it waits
    there; release; the change's answer."""
    turn = _Turn()
    monkeypatch.setattr(kernel.policy, "_write_lock", turn)
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        turn.lock.acquire()  # another change is saving
        post = threading.Thread(
            target=lambda: answers.append(
                http.post(f"/v1/policy/{verb}", headers=bearer(token), json=CHANGES[verb])
            )
        )
        post.start()
        try:
            assert turn.arrived.wait(60), "the change never reached the write lock"
            meanwhile(http)
        finally:
            turn.lock.release()
        post.join(60)
    assert answers, "the change never answered"
    return answers[0]


@pytest.mark.parametrize("verb", sorted(CHANGES))
def test_a_rest_policy_change_that_waited_for_its_turn_is_refused_for_a_key_revoked_meanwhile(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
) -> None:
    """Bug TU: the change reaches the write lock with a live operator key; the key is
    revoked by another process and the server already refuses it elsewhere; the change
    then gets its turn. It is asked again with the key: 401, nothing recorded."""
    if verb == "revoke":
        kernel.policy_grant(requested_by="test", **ASSIGNMENT)
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER, ["app", "operator"])
    before = _policy_changes(kernel)

    def revoked_elsewhere(http: httpx.Client) -> None:
        revoke_with_the_cli(settings, issued.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.get("/v1/policy", headers=bearer(issued.token))
        assert refused.status_code == 401, refused.text  # revoked, as the server sees it

    answer = _change_after_its_turn(
        server, kernel, keys, monkeypatch, verb, issued.token, revoked_elsewhere
    )
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthenticated"
    assert _policy_changes(kernel) == before


@pytest.mark.parametrize("verb", sorted(CHANGES))
def test_held_a_rest_policy_change_with_a_live_key_is_recorded_after_its_turn(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
) -> None:
    """The guard of TU's test: the same wait, the key standing (the server asked about
    it meanwhile): the change is recorded, each of its rows once, each with its entry."""
    if verb == "revoke":
        kernel.policy_grant(requested_by="test", **ASSIGNMENT)
    issued = keys.create(PLANNER, ["app", "operator"])
    versions, entries = _policy_changes(kernel)

    def still_standing(http: httpx.Client) -> None:
        shown = http.get("/v1/policy", headers=bearer(issued.token))
        assert shown.status_code == 200, shown.text

    answer = _change_after_its_turn(
        server, kernel, keys, monkeypatch, verb, issued.token, still_standing
    )
    assert answer.status_code == 200, answer.text
    made = len(answer.json()["changes"])
    assert made >= 1, answer.text
    assert _policy_changes(kernel) == (versions + made, entries + made)
