"""Hostile callers, round 8, on the web pages (decision 0173-hostile-callers-round-8), on
SQLite and PostgreSQL against a live server: each test failed on the code before its fix."""

from __future__ import annotations

import httpx
import pytest

from domain.principal import OPERATORS, PRIVACY_CENTER
from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.conftest import Backend
from tests.web.conftest import deny_operators, open_link, policy_store_down, privacy_link
from uprof.kernel import Uprof


def test_an_export_the_policy_refuses_is_the_refusal_page_with_403(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Bug LP: with operators denied ``audit`` (REST: 403), the console's audit download
    answered 422 "Export refused", the status of a malformed search, for the door's
    refusal: the one console page not giving the status REST gives (docs/web.md). The
    refusal is on the log, as every policy denial; a bad time is still 422."""
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        assert console.get("/console/audit/export").status_code == 200
        deny_operators(kernel, "audit", "compliance")
        rest = http.post("/v1/audit/export", headers=bearer(apps.planner_operator), json={})
        assert rest.status_code == 403, rest.text
        kernel.reads.drain()
        before = _denials(kernel)
        for params in ({}, {"format": "csv"}, {"subject": "alice"}):
            refused = console.get("/console/audit/export", params=params)
            assert refused.status_code == 403, (params, refused.status_code, refused.text[:200])
            assert refused.headers["content-type"].startswith("text/html")
            assert "Request refused" in refused.text
            assert "checkpoint" not in refused.text
        kernel.reads.drain()
        assert _denials(kernel) - before == 3
        bad = console.get("/console/audit/export", params={"since": "2026-13-01"})
        assert bad.status_code == 422 and "since: not a date and time" in bad.text


def _denials(kernel: Uprof) -> int:
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied")


@pytest.mark.parametrize("right", [("export", "access-request"), ("erase", "erasure")])
def test_a_link_stands_only_while_the_operators_may_export_and_erase(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, right: tuple[str, str]
) -> None:
    """Bug LQ: issuing a privacy-center link needs the operators' policy to allow
    ``export`` and ``erase`` (the link does both, whatever the policy says), but only at
    issue: an operator key issued itself a link, the deployment then denied operators
    ``export`` (or ``erase``; REST and new links: 403), and the link issued just before
    still opened a session that downloaded the whole profile, for its 15 minutes plus
    the session's hour. A link and its session now stand only while the policy allows
    what issuing them needed, decided again where the issuing key is: at sign-in and on
    every page; the refusal is audited under the link's principal."""
    action, purpose = right
    grant(http, apps.planner)
    unused = privacy_link(http, apps.planner_operator, "alice")
    with (
        httpx.Client(base_url=server.url, timeout=30) as signed_in,
        httpx.Client(base_url=server.url, timeout=30) as late,
    ):
        open_link(signed_in, privacy_link(http, apps.planner_operator, "alice"))
        assert signed_in.get("/privacy/export.json").status_code == 200
        deny_operators(kernel, action, purpose)
        issued = http.post(
            "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": "alice"}
        )
        assert issued.status_code == 403, issued.text
        kernel.reads.drain()
        before = _denials(kernel)
        refused = open_link(late, unused, expect=403)
        assert "Link not valid" in refused.text
        assert late.get("/privacy/export.json").status_code == 401
        ended = signed_in.get("/privacy/export.json")
        assert ended.status_code == 401, ended.text[:200]
        assert "consents" not in ended.text
        assert signed_in.get("/privacy").status_code == 401
    kernel.reads.drain()
    every = [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied"]
    denied = every[before:]  # the unused link's sign-in, and the open session's next page
    assert len(denied) == 2, denied
    assert all(e["principal"].startswith(f"{PRIVACY_CENTER}#") for e in denied), denied
    assert all(e["app_id"] == OPERATORS and e["reason_code"] == action for e in denied), denied


def test_a_policy_change_the_policy_refuses_is_one_refusal_on_the_log(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Bug LR: with operators denied ``policy``, a change posted from the console was
    refused (403) and then the page was drawn again to show the refusal beside the rules,
    which read the rules through the door, refused and audited too: one request, two
    ``access.denied`` entries, where REST writes one. An auditor counting an operator's
    refusals counted each console attempt twice. The refused change is now the refusal
    page, one entry; a change refused for its input still shows the form and the rules."""
    from tests.web.conftest import csrf_of

    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/policy").text)
        bad = console.post(
            "/console/policy/grant", data={"csrf": csrf, "app_id": "app:calendar", "role": "x"}
        )
        assert bad.status_code == 422 and "role:assistant" in bad.text  # the rules, shown
        deny_operators(kernel, "policy", "operations")
        kernel.reads.drain()
        before = _denials(kernel)
        rest = http.post(
            "/v1/policy/grant",
            headers=bearer(apps.planner_operator),
            json={"app_id": "app:calendar", "role": "role:assistant"},
        )
        assert rest.status_code == 403, rest.text
        kernel.reads.drain()
        assert _denials(kernel) - before == 1  # REST: one request, one entry
        before += 1
        change = {"csrf": csrf, "app_id": "app:calendar", "role": "role:assistant"}
        for verb in ("grant", "revoke"):
            refused = console.post(f"/console/policy/{verb}", data=change)
            assert refused.status_code == 403, refused.text[:200]
            assert "Request refused" in refused.text and "role:scheduler" not in refused.text
        kernel.reads.drain()
        assert _denials(kernel) - before == 2


def test_a_residue_scan_takes_a_bounded_number_of_terms(
    server: LiveServer, apps: Apps, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug LS: the console's residue scan took every line of the form as a term, as many
    as the body limit holds (1 MiB: ~100,000 short terms), and scanned for each: a file
    scan and one query per table column per term, about 3 ms a term on an empty SQLite
    folder and 53 ms on an empty PostgreSQL database, so one post held a server thread
    and a database connection for about an hour and a half, and the pool's 40 threads
    went with 40 posts. The door now refuses more than ``MAX_RESIDUE_TERMS`` terms (422,
    naming ``terms``) before anything is scanned; the form keeps what was typed."""
    from tests.web.conftest import csrf_of
    from uprof.facade import MAX_RESIDUE_TERMS

    scans: list[int] = []
    scan = kernel.residue_scan
    monkeypatch.setattr(
        kernel, "residue_scan", lambda terms: scans.append(len(terms)) or scan(terms)
    )
    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/receipts").text)
        many = "\n".join(f"Zq7-term-{i}" for i in range(MAX_RESIDUE_TERMS + 1))
        refused = console.post("/console/residue", data={"csrf": csrf, "terms": many})
        assert refused.status_code == 422, refused.text[-300:]
        assert f"terms: at most {MAX_RESIDUE_TERMS}" in refused.text
        assert "Zq7-term-0" in refused.text  # the form keeps what was typed
        assert scans == []
        done = console.post("/console/residue", data={"csrf": csrf, "terms": "Zq7\nZq8"})
        assert done.status_code == 200 and "erased streams" in done.text, done.text[-300:]
    assert scans == [2]


def test_a_policy_store_outage_refuses_the_privacy_center_and_keeps_its_sessions(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Held with the fix of bug LQ: while the policy store cannot be read every check
    denies, the link's too. The pages are refused (fail closed) but the session is not
    ended: it serves again once the store answers, rather than being signed out for good
    by an outage."""
    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        open_link(browser, privacy_link(http, apps.planner_operator, "alice"))
        assert browser.get("/privacy/export.json").status_code == 200
        with policy_store_down(backend, kernel):
            refused = browser.get("/privacy/export.json")
            assert refused.status_code >= 500 and "policy store unreadable" in refused.text
            assert "consents" not in refused.text
        assert browser.get("/privacy/export.json").status_code == 200
