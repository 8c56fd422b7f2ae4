"""Every console form is decided with the live key at the moment it acts (both backends,
a live server): a hostile operator whose key is revoked between loading a page and its
form's action, a form posted with another session's token, a form posted to another
tenant's server.

0208-sdk-deadline-and-console-door gave the console's door (``operator_door``) the key's
check where the facade decides a long action again (the residue scan, bug RM); its Left:
the policy page's writes were decided when they started. A policy change waits for its
turn (``PolicyService``'s write lock: another change of this process saving, or a
conflict with another process's, retried) and then wrote for a key revoked meanwhile
(bug SN); a verification of an upload (up to 20 MiB read and checked) showed its verdict
to a key revoked while it ran (bug SO).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests.api.conftest import CALENDAR, Apps, LiveServer
from tests.api.conftest import other as other  # the second tenant's fixture
from tests.web.conftest import console_cookie, csrf_of
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.web.pages import OPERATOR_COOKIE

#: A role assignment the seed policy does not hold (app:calendar is role:scheduler).
ASSIGNMENT = {"app_id": CALENDAR, "role": "role:assistant"}


def _signed_in(console: httpx.Client, key: str, page: str) -> str:
    """Sign ``console`` in with ``key``; the CSRF token of ``page``'s form."""
    signed = console.post("/console/login", data={"api_key": key}, follow_redirects=False)
    assert signed.status_code == 303, signed.text[-300:]
    shown = console.get(page)
    assert shown.status_code == 200, shown.text[:300]
    return csrf_of(shown.text)


def _key_id(keys: ApiKeyStore, token: str) -> str:
    principal = keys.authenticate(token)
    assert principal is not None
    return principal.key_id


def _policy_changes(kernel: Uprof) -> tuple[int, int]:
    """The policy's recorded changes and ``policy.changed`` entries, to compare."""
    kernel.reads.drain()
    entries = sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "policy.changed")
    return len(kernel.policy_history()), entries


class _Turn:
    """The policy service's write lock, held by the test: says when a change arrives at
    it, and lets it through when the test releases it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived = threading.Event()

    def __enter__(self) -> None:
        self.arrived.set()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


@pytest.mark.parametrize("verb", ["grant", "revoke"])
def test_a_policy_change_that_waited_for_its_turn_is_refused_for_a_key_revoked_meanwhile(
    server: LiveServer,
    apps: Apps,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
) -> None:
    """Bug SN: the form is posted while another change holds the policy's write lock;
    the key is revoked while it waits there. Decided again once it has its turn, before
    it stages: 403, nothing recorded, and the session is over."""
    if verb == "revoke":
        kernel.policy_grant(requested_by="test", **ASSIGNMENT)
    turn = _Turn()
    monkeypatch.setattr(kernel.policy, "_write_lock", turn)
    before = _policy_changes(kernel)
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=60) as console:
        csrf = _signed_in(console, apps.planner_operator, "/console/policy")
        turn.lock.acquire()  # another change is saving
        post = threading.Thread(
            target=lambda: answers.append(
                console.post(f"/console/policy/{verb}", data={"csrf": csrf, **ASSIGNMENT})
            )
        )
        post.start()
        try:
            assert turn.arrived.wait(60), "the change never reached the write lock"
            assert keys.revoke(_key_id(keys, apps.planner_operator))
        finally:
            turn.lock.release()
        post.join(60)
        assert answers, "the change never answered"
        after = console.get("/console/policy", follow_redirects=False)
    assert answers[0].status_code == 403, answers[0].text[-400:]
    assert "recorded, policy version" not in answers[0].text
    assert _policy_changes(kernel) == before
    assert after.status_code in (303, 403), after.status_code


def test_a_policy_change_with_a_live_key_is_recorded_after_its_turn(
    server: LiveServer, apps: Apps, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard of SN's test: the same wait, the key standing: the change is recorded."""
    turn = _Turn()
    monkeypatch.setattr(kernel.policy, "_write_lock", turn)
    versions, entries = _policy_changes(kernel)
    with httpx.Client(base_url=server.url, timeout=60) as console:
        csrf = _signed_in(console, apps.planner_operator, "/console/policy")
        done = console.post("/console/policy/grant", data={"csrf": csrf, **ASSIGNMENT})
    assert turn.arrived.is_set()
    assert done.status_code == 200, done.text[-400:]
    assert "1 change(s) recorded" in done.text
    assert _policy_changes(kernel) == (versions + 1, entries + 1)


def test_a_verdict_is_not_shown_once_the_key_was_revoked_during_the_verification(
    server: LiveServer,
    apps: Apps,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug SO: the upload is checked (up to 20 MiB, every line against the log's key);
    a key revoked while it was checked still got the verdict. Decided again after the
    check, as the residue scan's report: 403, no verdict."""
    verify = kernel.verify_audit
    key_id = _key_id(keys, apps.planner_operator)

    def revoked_during_the_check(*args: Any, **kwargs: Any) -> Any:
        verdict = verify(*args, **kwargs)
        assert keys.revoke(key_id)
        return verdict

    monkeypatch.setattr(kernel, "verify_audit", revoked_during_the_check)
    with httpx.Client(base_url=server.url, timeout=60) as console:
        csrf = _signed_in(console, apps.planner_operator, "/console/verify")
        checked = console.post(
            "/console/verify",
            data={"csrf": csrf, "kind": "export"},
            files={"upload": ("export.jsonl", b'{"not": "an export"}\n', "application/json")},
        )
    assert checked.status_code == 403, checked.text[-400:]
    assert "Verification failed" not in checked.text and "Verified" not in checked.text


#: Every console form that acts, with a body it accepts (the token added by the test).
FORMS: dict[str, dict[str, Any]] = {
    "policy-grant": {"path": "/console/policy/grant", "data": ASSIGNMENT},
    "policy-revoke": {"path": "/console/policy/revoke", "data": ASSIGNMENT},
    "residue": {"path": "/console/residue", "data": {"terms": "Zq7"}},
    "verify": {
        "path": "/console/verify",
        "data": {"kind": "export"},
        "files": {"upload": ("export.jsonl", b"{}\n", "application/json")},
    },
}


def _post(console: httpx.Client, form: str, csrf: str, **cookies: str) -> httpx.Response:
    spec = FORMS[form]
    return console.post(
        spec["path"],
        data={"csrf": csrf, **spec["data"]},
        files=spec.get("files"),
        cookies=cookies or None,
        follow_redirects=False,
    )


@pytest.mark.parametrize("form", sorted(FORMS))
def test_held_a_form_posted_after_its_key_was_revoked_does_nothing(
    server: LiveServer, apps: Apps, kernel: Uprof, keys: ApiKeyStore, form: str
) -> None:
    """Held: the page was loaded with a live key, the key revoked, then the form posted:
    refused before it acts (``checked_operator``), nothing recorded or shown."""
    kernel.policy_grant(requested_by="test", **ASSIGNMENT)  # so that a revoke would act
    with httpx.Client(base_url=server.url, timeout=60) as console:
        csrf = _signed_in(console, apps.planner_operator, "/console/receipts")
        before = _policy_changes(kernel)
        assert keys.revoke(_key_id(keys, apps.planner_operator))
        refused = _post(console, form, csrf)
    assert refused.status_code == 403, refused.text[-300:]
    assert "Your API key is no longer valid" in refused.text
    assert _policy_changes(kernel) == before


@pytest.mark.parametrize("form", sorted(FORMS))
def test_held_a_token_of_another_session_is_refused(
    server: LiveServer, apps: Apps, kernel: Uprof, keys: ApiKeyStore, form: str
) -> None:
    """Held: a form's CSRF token is its session's: the token of another operator's
    session (another key), or of an earlier session of the same key, posted with this
    session's cookie is refused before anything acts."""
    kernel.policy_grant(requested_by="test", **ASSIGNMENT)
    other_operator = keys.create(CALENDAR, ["app", "operator"]).token
    with (
        httpx.Client(base_url=server.url, timeout=60) as mine,
        httpx.Client(base_url=server.url, timeout=60) as theirs,
    ):
        earlier = _signed_in(mine, apps.planner_operator, "/console/receipts")
        out = mine.post("/console/logout", data={"csrf": earlier}, follow_redirects=False)
        assert out.status_code == 303, out.text[-300:]
        current = _signed_in(mine, apps.planner_operator, "/console/receipts")
        their_token = _signed_in(theirs, other_operator, "/console/receipts")
        before = _policy_changes(kernel)
        for token in (their_token, earlier):
            assert token != current
            refused = _post(mine, form, token)
            assert refused.status_code == 403, refused.text[-300:]
            assert "Form expired" in refused.text
    assert _policy_changes(kernel) == before


@pytest.mark.parametrize("form", sorted(FORMS))
def test_held_a_form_posted_to_another_tenants_server_is_no_session_there(
    kernel: Uprof,
    keys: ApiKeyStore,
    apps: Apps,
    other: tuple[Uprof, ApiKeyStore],
    form: str,
) -> None:
    """Held: a console session and its token, signed in on tenant A's server, posted to
    tenant B's on the same stores: no session there (sent to sign in), nothing recorded
    in B, and A's own session goes on."""
    other_kernel, other_keys = other
    other_kernel.policy_grant(requested_by="test", **ASSIGNMENT)
    with LiveServer(create_server(kernel, keys)) as here:
        with httpx.Client(base_url=here.url, timeout=60) as console:
            cookie = console_cookie(console, apps.planner_operator)
            csrf = csrf_of(console.get("/console/receipts").text)
        with (
            LiveServer(create_server(other_kernel, other_keys)) as there,
            httpx.Client(base_url=there.url, timeout=60) as elsewhere,
        ):
            before = _policy_changes(other_kernel)
            posted = _post(elsewhere, form, csrf, **{OPERATOR_COOKIE: cookie})
            assert posted.status_code == 303, posted.text[-300:]
            assert posted.headers["location"] == "/console/login"
            assert _policy_changes(other_kernel) == before
        with httpx.Client(base_url=here.url, timeout=60) as console:
            own = console.get("/console/receipts", cookies={OPERATOR_COOKIE: cookie})
            assert own.status_code == 200, own.text[-300:]
