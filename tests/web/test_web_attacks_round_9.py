"""Hostile callers, round 9, on the pages that changed since round 8 (decision
0205-hostile-callers-round-9), on SQLite and PostgreSQL against a live server: the
residue form's new term checks, the console's public key download, the sign-in link
held while in use. Each held; kept so that they go on holding."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.web.conftest import (
    audit_denied_during_the_scan,
    csrf_of,
    deny_operators,
    link_token,
    open_link,
    privacy_link,
)
from uprof.kernel import Uprof


@pytest.mark.parametrize(
    ("term", "says"),
    [("x" * 201, "201 characters, at most 200"), ("a\x00b", "NUL")],
    ids=["long", "nul"],
)
def test_the_console_residue_form_refuses_a_bad_term_naming_it_before_any_scan(
    server: LiveServer,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
    term: str,
    says: str,
) -> None:
    """Reviews of 0187 (PC) and bug MW made the door refuse an over-long or NUL term; the
    console reaches the same door: 422 naming ``terms[1]``, and no scan started. (A blank
    line of the form is no term: the console skips it, so ME's blank term is the CLI's.)"""
    scans: list[int] = []
    scan = kernel.residue_scan
    monkeypatch.setattr(kernel, "residue_scan", lambda t: scans.append(len(t)) or scan(t))
    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/receipts").text)
        refused = console.post("/console/residue", data={"csrf": csrf, "terms": f"Zq7\n{term}"})
    assert refused.status_code == 422, refused.text[-300:]
    assert "terms[1]" in refused.text and says in refused.text, refused.text[-400:]
    assert scans == []


def test_the_console_key_download_is_public_but_not_to_a_stranger(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """0188 made the console's key download and verify form read the key without the
    policy (``audit_public_key``): public, so an operator denied ``audit`` still gets the
    key (no checkpoint: it says how much the deployment wrote), while no session, or an
    app key's, gets no key at all."""
    pem = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()["public_key_pem"]
    with httpx.Client(base_url=server.url, timeout=30) as stranger:
        anonymous = stranger.get("/console/public-key.pem", follow_redirects=False)
        assert pem not in anonymous.text
        stranger.post("/console/login", data={"api_key": apps.planner})  # no operator role
        assert pem not in stranger.get("/console/public-key.pem").text
    deny_operators(kernel, "audit", "compliance")
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        got = console.get("/console/public-key.pem")
        assert got.status_code == 200 and got.text == pem
        assert console.get("/console/verify").status_code == 200  # the form needs the origin only
    key = http.get("/v1/audit/key", headers=bearer(apps.planner_operator)).json()
    assert key.get("checkpoint") is None  # denied audit: the key, never the log's size


def test_a_spent_link_is_dead_and_the_form_cannot_name_another_subject(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    """The link held while in use (0186, 0199): once a sign-in spent it, another press,
    from this browser or another, is 403 "Link not valid", never 409 "in use"; and the
    sign-in form's extra fields (a subject, a tenant, a key id) choose nothing: the
    session is the link's subject's."""
    grant(http, apps.planner, subject="alice")
    grant(http, apps.planner, subject="bob")
    login_path = privacy_link(http, apps.planner_operator, "alice")
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        token = link_token(browser, login_path)
        signed = browser.post(
            "/privacy/login",
            data={"token": token, "subject": "bob", "tenant": "other", "key_id": "x"},
            headers={"X-Uprof-Subject": "bob"},
            params={"subject": "bob"},
        )
        assert signed.status_code == 303, signed.text
        export = browser.get("/privacy/export.json")
        assert export.status_code == 200 and '"bob"' not in export.text
        again = browser.post("/privacy/login", data={"token": token})
        assert again.status_code == 403 and "Link not valid" in again.text
    with httpx.Client(base_url=server.url, timeout=30) as other_browser:
        open_link(other_browser, login_path, expect=403)


def test_a_withdrawal_with_erase_whose_erase_right_was_denied_during_the_wait_erases_nothing(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug QV: ``POST /v1/consents/withdraw`` with ``erase`` by an operator decides the
    operators' ``erase`` (an erasure on the operator's word), then the kernel's
    withdrawal waits (the reads settling, the views) and withdraws and erases, whatever
    the policy said by then: NI's defect (review of 0176, decision 0182) on the door its
    fix did not reach. Another real process denies operators ``erase`` during that wait:
    decided again before the first write, 403, audited, nothing withdrawn or erased."""
    from tests.web.conftest import lisbon_item
    from tests.web.test_outage_links import _denied_during_the_wait, _erasures

    consent_id = lisbon_item(http, apps, kernel).consent_id
    waits: list[list[bool]] = []
    withdraw = kernel.withdraw_consent

    def withdraw_denied_during_its_wait(*args: Any, **kwargs: Any) -> Any:
        # The kernel's own wait, after the door's decision (the door's consent read
        # waited before it, which the decision already follows).
        waits.append(_denied_during_the_wait(kernel, monkeypatch, "subject", "role:operator"))
        return withdraw(*args, **kwargs)

    monkeypatch.setattr(kernel, "withdraw_consent", withdraw_denied_during_its_wait)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        refused = client.post(
            "/v1/consents/withdraw",
            headers=bearer(apps.planner_operator),
            json={"subject": "alice", "consent_id": consent_id, "erase": True},
        )
    assert waits == [[True]]
    assert refused.status_code == 403, refused.text[:300]
    assert refused.json()["error"]["code"] == "permission_denied"
    assert _erasures(kernel) == []
    profile = kernel.profile("alice")
    assert "Lisbon" in str(profile)
    assert all(c.withdrawn_at is None for c in profile.consents)
    denied = [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied"]
    assert denied and denied[-1]["reason_code"] == "erase"


def test_a_residue_report_is_not_shown_once_audit_was_denied_during_the_scan(
    server: LiveServer, apps: Apps, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The residue scan (``audit``) is decided before it reads every file and table,
    which on stores at scale takes minutes (0187); a deployment that denies its
    operators ``audit`` meanwhile must not be shown the report (where the terms were
    found, the erased streams, erasures in progress): 403, the refusal audited once, no
    report. Held on main: the page draws the receipts beside the report, decided again.
    The door itself decides the scan again since bug QW (tests/api, round 9)."""
    audit_denied_during_the_scan(kernel, monkeypatch)
    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/receipts").text)
        kernel.reads.drain()
        before = _denials(kernel)
        refused = console.post("/console/residue", data={"csrf": csrf, "terms": "Zq7"})
    assert refused.status_code == 403, refused.text[-300:]
    assert "Residue:" not in refused.text and "erased streams" not in refused.text
    kernel.reads.drain()
    assert _denials(kernel) == before + 1


def _denials(kernel: Uprof) -> int:
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied")


def test_a_keyed_withdrawal_refused_after_its_wait_keeps_its_key_for_one_erasure(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """I14 through QV's new decision: a keyed withdrawal with ``erase`` refused after the
    kernel's wait wrote nothing, so its ``Idempotency-Key`` replays no refusal: sent again
    once the operators may erase, it erases once, with a receipt; the same key again
    replays that answer, and with another body is 409 ``idempotency_key_reused``."""
    from tests.web.conftest import lisbon_item

    consent_id = lisbon_item(http, apps, kernel).consent_id
    withdraw = kernel.withdraw_consent

    def denied_in_the_kernels_wait(*args: Any, **kwargs: Any) -> Any:
        deny_operators(kernel, "erase", "erasure")  # after the door's first decision
        return withdraw(*args, **kwargs)

    body = {"subject": "alice", "consent_id": consent_id, "erase": True}
    keyed = {**bearer(apps.planner_operator), "Idempotency-Key": "w-1"}
    with monkeypatch.context() as patched:
        patched.setattr(kernel, "withdraw_consent", denied_in_the_kernels_wait)
        refused = http.post("/v1/consents/withdraw", headers=keyed, json=body)
    assert refused.status_code == 403, refused.text[:300]
    kernel.policy_revoke(
        requested_by="test",
        role="role:operator",
        actions=["erase"],
        categories=["any"],
        purpose="erasure",
        effect="deny",
    )
    done = http.post("/v1/consents/withdraw", headers=keyed, json=body)
    assert done.status_code == 200, done.text[:300]
    receipt = done.json()["erasure"]
    assert receipt is not None
    again = http.post("/v1/consents/withdraw", headers=keyed, json=body)
    # The replay is the first answer but for the subject's nonce (first answer only).
    assert again.status_code == 200 and again.json()["erasure"]["receipt"] == receipt["receipt"]
    reused = http.post("/v1/consents/withdraw", headers=keyed, json={**body, "erase": False})
    assert reused.status_code == 409, reused.text[:300]
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    kernel.reads.drain()
    actions = [e.entry["action"] for e in kernel.audit_log.entries()]
    assert actions.count("consent.withdrawn") == 1
