"""Privacy links and sessions across database outages and waits (leftovers of 0173 and
0176), on SQLite and PostgreSQL against a live server: each test failed on main before
its fix, or says it held."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from tests.conftest import Backend, pg_database_down
from tests.web.conftest import (
    csrf_of,
    link_token,
    lisbon_item,
    policy_store_down,
    privacy_link,
    signed_in,
    table_gone,
)
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


@contextlib.contextmanager
def database_down(backend: Backend, uprof: Uprof) -> Iterator[None]:
    """The deployment's database out for the block, back after it.

    PostgreSQL: the database refuses new connections and its open ones are ended by the
    server (``ALLOW_CONNECTIONS false``, ``pg_terminate_backend``), as an outage or a
    failover does. SQLite: the key store's subject index (what a sign-in reads first) is
    renamed away under the live server by another connection, so every read of it fails
    (a lock held by another process would do only after the 30 s busy timeout, and
    WAL lets readers through it). Since bug NR (review of 0182) that stand-in is a fault,
    500, as a missing table is on PostgreSQL, not an outage: it checks only that the link
    is kept; what SQLite says when it does not answer is mapped in
    ``tests/web/test_review_0179_0182.py``."""
    if backend.kind == "postgres":
        with pg_database_down(backend.pg_dbname):
            yield
        return
    with table_gone(backend, uprof, "subject_index"):
        yield


def test_a_sign_in_during_a_database_outage_keeps_the_link_and_answers_503(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug NH: 0176 (MG) gave the link back only for a policy-store outage; a sign-in
    while the database itself did not answer (the subject's name looked up first) spent
    the link and answered 500 "internal": once the database was back the same link said
    "Link not valid". Now nothing that stops the sign-in before its session exists spends
    the link, and a database that does not answer is 503 with ``Retry-After``."""
    grant(http, apps.planner)
    login = privacy_link(http, apps.planner_operator, "alice")
    # A connection per request: the server ends the one it answered a fault (500) on,
    # and the next request must not race that end.
    with httpx.Client(base_url=server.url, timeout=120, headers={"Connection": "close"}) as browser:
        token = link_token(browser, login)
        with database_down(backend, kernel):
            refused = browser.post("/privacy/login", data={"token": token})
            assert "uprof_privacy" not in refused.cookies
            rest = None
            if backend.kind == "sqlite":
                # REST the same (a fault since bug NR), on its own connection: the server
                # ends one it answered a fault on. Not on PostgreSQL: there a request
                # reaching the policy first waits out its store's pool ten times (2 s
                # each since bug NK, the next test).
                with httpx.Client(base_url=server.url, timeout=120) as operator:
                    rest = operator.post(
                        "/v1/privacy/links",
                        headers=bearer(apps.planner_operator),
                        json={"subject": "alice"},
                    )
        signed = browser.post("/privacy/login", data={"token": token})
        assert signed.status_code == 303, signed.text[:300]
        if backend.kind == "postgres":
            assert refused.status_code == 503, (refused.status_code, refused.text[:300])
            assert int(refused.headers["Retry-After"]) > 0
            assert "database did not answer" in refused.text
        else:  # a missing table, a fault (bug NR): the link is kept all the same
            assert refused.status_code == 500, (refused.status_code, refused.text[:300])
            assert "Retry-After" not in refused.headers
        if rest is not None:
            assert rest.status_code == 500, rest.text[:300]
            assert rest.json()["error"]["code"] == "internal"
        assert browser.get("/privacy/export.json").status_code == 200
        # Still single-use: the session took it.
        again = browser.post("/privacy/login", data={"token": token})
        assert again.status_code == 403 and "Link not valid" in again.text


def _deny_erase_in_child(settings_json: str, role: str) -> None:
    """Another process (a second kernel on the same stores, as ``uprof policy`` is)
    denies ``role`` the action ``erase`` for purpose ``erasure``, in every category."""
    from tests.api.conftest import build_kernel
    from tests.web.conftest import deny_operators
    from uprof.settings import Settings

    other = build_kernel(Settings.model_validate_json(settings_json))
    try:
        deny_operators(other, "erase", "erasure", role=role)
    finally:
        other.close()


def _denied_during_the_wait(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, scope: str, role: str
) -> list[bool]:
    """During the erasure's own wait (the views catching up for one item, the reads
    settling for a whole subject), another real process denies ``role`` erasure; the
    wait ends after the policy's refresh bound (decision 0015), so this server's next
    decision reads the new policy."""
    from tests import children

    owner, name = (
        (kernel.erasure_service, "_require_views_current")
        if scope == "item"
        else (kernel, "_settle_reads")
    )
    real = getattr(owner, name)
    waited: list[bool] = []

    def wait(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        if not waited:
            waited.append(True)
            child = children.CONTEXT.Process(
                target=_deny_erase_in_child, args=(kernel.settings.model_dump_json(), role)
            )
            child.start()
            child.join(120)
            assert child.exitcode == 0
            time.sleep(kernel.settings.policy_refresh_s * 2)
        return answer

    monkeypatch.setattr(owner, name, wait)
    return waited


def _erasures(kernel: Uprof) -> list[str]:
    return [
        e.entry["action"]
        for e in kernel.audit_log.entries()
        if e.entry["action"].startswith(("erasure.", "key.destroyed"))
    ]


@pytest.mark.parametrize("scope", ["item", "everything"])
def test_a_privacy_center_erasure_whose_link_lost_its_rights_during_the_wait_erases_nothing(
    scope: str,
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug NI: the privacy center decided the link (its issuing key, the operators'
    ``export`` and ``erase``, 0173) when the erasure was posted, then the erasure waited
    (the views, the reads) and erased, with a receipt, though another process had denied
    operators ``erase`` meanwhile. The link is worth its issuer's rights (0173), and an
    erasure cannot be undone: decided again after the wait, it erases nothing and says
    so; the subject keeps the session's other pages only while the link stands."""
    item = lisbon_item(http, apps, kernel).item_id
    with signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as user:
        form = user.get("/privacy/erase", params={"item_id": item} if scope == "item" else {})
        assert form.status_code == 200, form.text[:300]
        waited = _denied_during_the_wait(kernel, monkeypatch, scope, "role:operator")
        data = {"csrf": csrf_of(form.text), "confirm": "yes"}
        if scope == "item":
            data["item_id"] = item
        refused = user.post("/privacy/erase", data=data, follow_redirects=False)
    assert waited == [True]
    assert refused.status_code == 403, (refused.status_code, refused.text[:300])
    assert "no longer stands" in refused.text
    assert _erasures(kernel) == []
    assert "Lisbon" in str(kernel.profile("alice"))
    denied = [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied"]
    assert denied and denied[-1]["principal"].startswith("privacy-center#")


@pytest.mark.parametrize("scope", ["item", "subject"])
def test_a_rest_erasure_whose_erase_right_was_denied_during_the_wait_erases_nothing(
    scope: str,
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug NI, REST: ``POST /v1/governance/erasures/{item,subject}`` decided ``erase`` for
    the key's app before the erasure's wait and erased after it, whatever the policy said
    by then (another process denied the app's role ``erase`` during the wait). Decided
    again before the first write: 403, audited, nothing erased."""
    item = lisbon_item(http, apps, kernel).item_id
    waited = _denied_during_the_wait(kernel, monkeypatch, scope, "role:dpo")
    body = {"subject": "alice", **({"item_id": item} if scope == "item" else {})}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        refused = client.post(
            f"/v1/governance/erasures/{scope}", headers=bearer(apps.privacy), json=body
        )
    assert waited == [True]
    assert refused.status_code == 403, refused.text[:300]
    assert refused.json()["error"]["code"] == "permission_denied"
    assert _erasures(kernel) == []
    assert "Lisbon" in str(kernel.profile("alice"))
    denied = [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied"]
    assert denied and denied[-1]["reason_code"] == "erase"


def test_a_policy_store_outage_answers_each_surface_as_documented(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """While the policy store cannot be read, a REST call the policy decides is 503
    ``policy_store_unavailable`` naming the outage, with ``Retry-After`` (a capture, an
    export, reading or changing the policy: the change is refused at its decision,
    before the store); until bug QL it was 403 ``permission_denied`` (0015's choice),
    which an agent reads as a "no". The privacy center, whose link is decided again on
    every page, answers 503 with ``Retry-After`` and keeps the session (0176), as
    before."""
    grant(http, apps.planner)
    with signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as browser:
        with policy_store_down(backend, kernel):
            calls = [
                (apps.planner, "/v1/captures", {"subject": "alice", **interaction("hi")}),
                (apps.privacy, "/v1/governance/exports", {"subject": "alice"}),
                (
                    apps.planner_operator,
                    "/v1/policy/grant",
                    {
                        "role": "role:assistant",
                        "actions": ["read"],
                        "categories": ["diet"],
                        "purpose": "personalization",
                    },
                ),
            ]
            answers = [http.post(path, headers=bearer(key), json=body) for key, path, body in calls]
            answers.append(http.get("/v1/policy", headers=bearer(apps.planner_operator)))
            page = browser.get("/privacy")
        for answer in answers:
            assert answer.status_code == 503, answer.text[:300]
            assert int(answer.headers["Retry-After"]) > 0
            error = answer.json()["error"]
            assert error["code"] == "policy_store_unavailable"
            assert "policy store unreadable" in error["message"]
        assert page.status_code == 503 and int(page.headers["Retry-After"]) > 0
        assert browser.get("/privacy").status_code == 200  # the session was kept


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_request_during_a_postgres_outage_is_answered_not_held(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    keys: ApiKeyStore,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug NK: with the database down, a request whose key was just seen (the key
    cache answers) reached the policy's version check, which waited for a connection of
    the policy store's pool (30 s) ten times over, holding the policy's lock: the request
    was not answered within two minutes (the client's timeout here), and every other
    decision of the process waited behind it. The pool's wait is 2 s now: refused (the
    policy denies while it cannot read its store), and served again after the outage."""
    # The key's row stays cached (its clock stopped): the request passes authentication
    # without the database and reaches the policy, as any request within the cache's
    # 2 s of the key's last one does.
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    assert http.get("/v1/policy", headers=bearer(apps.planner_operator)).status_code == 200
    with httpx.Client(base_url=server.url, timeout=120) as client:
        with database_down(backend, kernel):
            time.sleep(kernel.settings.policy_refresh_s * 2)  # the policy's next check due
            refused = client.get("/v1/policy", headers=bearer(apps.planner_operator))
        assert refused.status_code == 503, refused.text[:300]
        assert refused.json()["error"]["code"] in ("policy_store_unavailable", "store_unavailable")
        kernel.policy_health()  # the store read again now, not at the next refresh
        again = client.get("/v1/policy", headers=bearer(apps.planner_operator))
        assert again.status_code == 200, again.text[:300]
