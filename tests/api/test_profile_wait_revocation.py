"""A whole-profile read that waits for read-your-writes is answered only if its key and
its right still stand after the wait (SQLite and PostgreSQL, a live server).

``POST /v1/profile/read``, ``/v1/evidence/read`` and ``/v1/governance/exports`` wait up to
``read_wait_timeout_s`` (30 s by default) for the subject's views. The key was checked
when the request came in and the policy's ``inspect`` (``export``) asked before the wait:
a key revoked during the wait (``uprof apps revoke`` in another process), or an operator
right the deployment took away meanwhile, still got the whole, ungated profile, its
captured text or the complete export, and the read was recorded under the revoked key
(found 2026-12-05; slices were fixed for the same wait earlier that day,
tests/api/test_slice_wait_revocation.py). The door now asks the key and the policy again
after the read and before it records or answers it.

The wait is simulated, as for slices: the kernel's freshness wait revokes elsewhere and
lets the server's read of the key row age past ``KEY_CACHE_TTL_S``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, Apps, bearer, grant, interaction
from tests.api.test_slice_wait_revocation import revoke_elsewhere
from tests.children import run_python
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

TEXT = "I live in Lisbon"


def _an_item(http: httpx.Client, apps: Apps, kernel: Uprof) -> str:
    grant(http, apps.planner)
    captured = http.post(
        "/v1/captures", headers=bearer(apps.planner), json={"subject": "alice", **interaction(TEXT)}
    )
    assert captured.status_code == 201, captured.text
    assert kernel.wait_until_caught_up(30)
    view = kernel.profile("alice")
    items = [*view.attributes, *view.memories, *view.intents]
    assert items, view
    return str(items[0].item_id)


def during_the_wait(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, what: Callable[[], None]
) -> list[bool]:
    """Run ``what`` once, inside the first read-your-writes wait of a whole-view read."""
    real = kernel.ensure_subject_fresh
    waited: list[bool] = []

    def wait(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        if not waited:
            what()
            waited.append(True)
        return answer

    monkeypatch.setattr(kernel, "ensure_subject_fresh", wait)
    return waited


def _recorded(kernel: Uprof) -> list[str]:
    kernel.reads.drain()
    return [
        e.entry["action"]
        for e in kernel.audit_log.entries()
        if e.entry["action"] in ("subject.read", "subject.exported")
    ]


def _reads(item: str) -> list[tuple[str, dict[str, str]]]:
    return [
        ("/v1/profile/read", {"subject": "alice"}),
        ("/v1/evidence/read", {"subject": "alice", "item_id": item}),
        ("/v1/governance/exports", {"subject": "alice"}),
    ]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["profile", "evidence", "export"])
def test_a_key_revoked_during_the_wait_gets_no_profile(
    which: int,
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, body = _reads(_an_item(http, apps, kernel))[which]
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER, ["app", "operator"])
    before = _recorded(kernel)
    waited = during_the_wait(
        kernel, monkeypatch, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    read = http.post(path, headers=bearer(issued.token), json=body)

    assert waited == [True]
    assert read.status_code == 401, read.text
    assert read.json()["error"]["code"] == "unauthenticated"
    assert "Lisbon" not in read.text
    assert _recorded(kernel) == before  # nothing served, nothing recorded as read


def test_a_key_revoked_by_the_cli_in_another_process_during_the_wait_gets_no_profile(
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same with ``uprof apps revoke`` run as a process of its own."""
    _an_item(http, apps, kernel)
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER, ["app", "operator"])
    cli = ["--data-dir", str(settings.data_dir), "--embedder", "hashing"]
    if settings.database_url:
        cli += ["--database-url", settings.database_url]

    def revoke_with_the_cli() -> None:
        script = "import sys\nfrom uprof.cli.main import app\napp(sys.argv[1:])"
        done = run_python(script, *cli, "apps", "revoke", issued.info.key_id)
        assert done.returncode == 0, done.stdout + done.stderr
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the wait outlived the server's read of the row

    before = _recorded(kernel)
    waited = during_the_wait(kernel, monkeypatch, revoke_with_the_cli)
    read = http.post("/v1/profile/read", headers=bearer(issued.token), json={"subject": "alice"})

    assert waited == [True]
    assert read.status_code == 401, read.text
    assert "Lisbon" not in read.text
    assert _recorded(kernel) == before


@pytest.mark.parametrize("which", [0, 1, 2], ids=["profile", "evidence", "export"])
def test_a_right_taken_away_during_the_wait_gets_no_profile(
    which: int,
    http: httpx.Client,
    kernel: Uprof,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, body = _reads(_an_item(http, apps, kernel))[which]
    before = _recorded(kernel)

    def take_rights_away() -> None:
        kernel.policy_revoke(
            requested_by="operator:local#cli",
            role="role:operator",
            actions=["inspect" if which < 2 else "export"],
            categories=["any"],
            purpose="operations" if which < 2 else "access-request",
        )

    waited = during_the_wait(kernel, monkeypatch, take_rights_away)
    read = http.post(path, headers=bearer(apps.planner_operator), json=body)

    assert waited == [True], read.text
    assert read.status_code == 403, read.text
    assert read.json()["error"]["code"] == "permission_denied"
    assert "Lisbon" not in read.text
    assert _recorded(kernel) == before
    denied = [e.entry for e in kernel.audit_entries(action="access.denied")]
    assert [d["reason_code"] for d in denied] == ["inspect" if which < 2 else "export"]


def test_a_live_key_gets_the_profile_after_a_long_wait(
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    item = _an_item(http, apps, kernel)
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER, ["app", "operator"])

    def long_wait() -> None:
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the key row is read again after the wait

    for path, body in _reads(item):
        waited = during_the_wait(kernel, monkeypatch, long_wait)
        read = http.post(path, headers=bearer(issued.token), json=body)
        assert waited == [True], path
        assert read.status_code == 200 and "Lisbon" in read.text, (path, read.text)
        monkeypatch.undo()
        monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    assert _recorded(kernel) == ["subject.read", "subject.read", "subject.exported"]
