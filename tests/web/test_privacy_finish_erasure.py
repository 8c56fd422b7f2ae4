"""The privacy center shows a consent whose erasure stopped half-way, and finishes it
(both backends, a live server).

A withdrawal with ``erase`` writes the withdrawal, then erases what the app collected
under the consent. When the request stops between the two (its wait for the views ran
out, its process was killed) or its erasure answers ``erasure_incomplete`` (the purge
not confirmed in time), the consent is withdrawn with erase requested and the data is
still there, or its receipt never issued. Since bug RE asking again finishes it, and the
withdraw route accepts the subject's withdrawn consent, but the page showed such a
consent as merely "withdrawn", with a "Grant again" button and no way to finish
(0207-review-of-0203-and-0205, Left; bug SP). It now says "erasure not finished" and
offers "Finish erasure": the same withdrawal with ``erase``, for the owner only,
decided again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from audit.receipts import RECEIPT_ACTION
from domain.errors import ReadTimeoutError
from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from tests.web.conftest import (
    csrf_of,
    lisbon_item,
    needs_chromium,
    privacy_link,
    shot,
    signed_in,
)
from tests.web.test_browser import sign_in_user
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def _once(owner: Any, name: str, stop: Callable[..., Any]) -> None:
    """Make ``owner.name`` answer ``stop(*args)`` on its first call only (the stop of
    one request), as itself afterwards. Undone by the test's end (``monkeypatch``)."""
    real = getattr(owner, name)
    calls: list[int] = []

    def first_stops(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            return stop(*args, **kwargs)
        return real(*args, **kwargs)

    setattr(owner, name, first_stops)


def _views_wait_runs_out(*_: Any) -> None:
    raise ReadTimeoutError("the views did not catch up with the log (test)")


#: How the first erasure stops: before it began (its wait for the views ran out after
#: the withdrawal was written), or once its keys were destroyed (the purge not confirmed
#: in time: ``erasure_incomplete``, the ledger keeps its draft).
STOPS: dict[str, tuple[str, Callable[..., Any], int]] = {
    "never-began": ("_require_views_current", _views_wait_runs_out, 503),
    "incomplete": ("_left_after", lambda *_: "projections behind", 503),
}


def stops_once(kernel: Uprof, monkeypatch: pytest.MonkeyPatch, stop: str) -> int:
    """The kernel's next erasure stops as ``STOPS[stop]`` says (once; undone by the test's
    end); returns the status its request is answered with."""
    name, how, status = STOPS[stop]
    monkeypatch.setattr(kernel.erasure_service, name, getattr(kernel.erasure_service, name))
    _once(kernel.erasure_service, name, how)
    return status


def _withdraw_form(page: str, consent_id: str) -> dict[str, str]:
    """The fields of the form the page offers for ``consent_id`` (its row's form)."""
    row = re.search(rf'<tr data-consent="{re.escape(consent_id)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for consent {consent_id}"
    form = re.search(
        r'<form method="post" action="/privacy/consents/withdraw">(.*?)</form>', row[1], re.S
    )
    assert form, f"no withdraw form in the row: {row[1]}"
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form[1]))


def _stopped_half_way(
    user: httpx.Client, kernel: Uprof, consent_id: str, stop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subject withdraws the consent with erase from the page; the erasure stops."""
    status = stops_once(kernel, monkeypatch, stop)
    csrf = csrf_of(user.get("/privacy").text)
    stopped = user.post(
        "/privacy/consents/withdraw", data={"csrf": csrf, "consent_id": consent_id, "erase": "1"}
    )
    assert stopped.status_code == status, stopped.text[-300:]
    assert kernel.wait_until_caught_up(30)
    (held,) = [c for c in kernel.profile("alice").consents if c.consent_id == consent_id]
    assert held.withdrawn_at is not None and held.erase_requested


def _receipts(kernel: Uprof) -> int:
    kernel.reads.drain()
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == RECEIPT_ACTION)


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_an_erasure_stopped_half_way_is_shown_and_finished_from_the_page(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
    stop: str,
) -> None:
    """Bug SP: the page says the erasure is not finished and offers to finish it; the
    button erases what was collected, with a receipt, and the state is gone."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    receipts = _receipts(kernel)
    with signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as user:
        _stopped_half_way(user, kernel, consent_id, stop, monkeypatch)
        page = user.get("/privacy")
        assert page.status_code == 200, page.text[-300:]
        assert "erasure not finished" in page.text
        assert "Grant again to app:planner" not in page.text
        form = _withdraw_form(page.text, consent_id)
        assert form["erase"] == "1" and form["consent_id"] == consent_id
        finished = user.post("/privacy/consents/withdraw", data=form, follow_redirects=False)
        assert finished.status_code == 303, finished.text[-300:]
        assert finished.headers["location"] == "/privacy?notice=erased"
        assert kernel.wait_until_caught_up(30)
        after = user.get(finished.headers["location"])
        shown = user.get("/privacy/receipts")
    assert "erasure not finished" not in after.text
    assert "what the app collected under it erased" in after.text
    assert "Lisbon" not in str(kernel.profile("alice"))
    assert _receipts(kernel) == receipts + 1
    assert "consent withdrawal" in shown.text
    assert kernel.consent_erasures_unfinished("alice") == frozenset()


def test_an_erasure_that_finished_is_not_shown_unfinished(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """The guard: an erasure that finished, and a consent withdrawn without erase, are
    shown withdrawn, with no finish button."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    kept = grant(http, apps.calendar, categories=("schedule",), purposes=("scheduling",))
    with signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as user:
        for withdrawn, erase in ((consent_id, "1"), (kept, "")):
            csrf = csrf_of(user.get("/privacy").text)
            done = user.post(
                "/privacy/consents/withdraw",
                data={"csrf": csrf, "consent_id": withdrawn, "erase": erase},
                follow_redirects=False,
            )
            assert done.status_code == 303, done.text[-300:]
        assert kernel.wait_until_caught_up(30)
        page = user.get("/privacy").text
    assert "erasure not finished" not in page and "Finish erasure" not in page
    assert kernel.consent_erasures_unfinished("alice") == frozenset()


def test_another_subject_cannot_finish_it(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bob's session posts the finish form with Alice's consent id: as a consent
    he never gave (404), nothing erased; Alice's page still offers it."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    grant(http, apps.planner, subject="bob")
    assert (
        http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "bob", **interaction("I live in Porto")},
        ).status_code
        == 201
    )
    with (
        signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as alice,
        signed_in(server, privacy_link(http, apps.planner_operator, "bob")) as bob,
    ):
        _stopped_half_way(alice, kernel, consent_id, "never-began", monkeypatch)
        csrf = csrf_of(bob.get("/privacy").text)
        refused = bob.post(
            "/privacy/consents/withdraw",
            data={"csrf": csrf, "consent_id": consent_id, "erase": "1"},
        )
        assert refused.status_code == 404, refused.text[-300:]
        assert "erasure not finished" in alice.get("/privacy").text
    assert "Lisbon" in str(kernel.profile("alice"))


def test_the_finish_is_refused_once_the_links_issuer_was_revoked(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The finish is decided as the withdrawal is (the link's issuing key must
    stand): revoked after the page was shown, the button erases nothing (401)."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    with signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as user:
        _stopped_half_way(user, kernel, consent_id, "never-began", monkeypatch)
        form = _withdraw_form(user.get("/privacy").text, consent_id)
        principal = keys.authenticate(apps.planner_operator)
        assert principal is not None and keys.revoke(principal.key_id)
        refused = user.post("/privacy/consents/withdraw", data=form)
    assert refused.status_code == 401, refused.text[-300:]
    assert "Lisbon" in str(kernel.profile("alice"))
    assert kernel.consent_erasures_unfinished("alice") == frozenset({consent_id})


@needs_chromium
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_in_chromium_the_subject_sees_the_unfinished_erasure_and_finishes_it(
    page: Any,
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug SP in a real browser: the subject ticks "also erase" and withdraws; the
    erasure stops (its wait for the views runs out); back on the page the consent says
    "erasure not finished" and the "Finish erasure" button erases it, with a receipt."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    stops_once(kernel, monkeypatch, "never-began")
    sign_in_user(page, server.url + privacy_link(http, apps.planner_operator, "alice"))
    row = page.locator(f'tr[data-consent="{consent_id}"]')
    row.get_by_label("also erase what it collected").check()
    row.get_by_role("button", name="Withdraw consent for app:planner").click()
    page.get_by_role("heading", name="Request refused").wait_for()
    assert kernel.wait_until_caught_up(30)
    page.goto(f"{server.url}/privacy")
    row.get_by_text("erasure not finished").wait_for()
    shot(page, "privacy-erasure-not-finished")
    row.get_by_role("button", name="Finish erasing what app:planner collected").click()
    page.get_by_text("what the app collected under it erased").wait_for()
    assert row.get_by_text("erasure not finished").count() == 0
    page.get_by_role("link", name="Receipts").first.click()
    page.get_by_text("consent withdrawal").first.wait_for()
    assert "Lisbon" not in str(kernel.profile("alice"))
