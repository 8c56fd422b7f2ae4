"""QV's last window: the operators' ``erase`` denied during the erasure's own wait, after
the withdrawal is written (both backends, a live server, the denial from another real
process).

0205-hostile-callers-round-9 (bug QV) decides an operator's withdrawal with ``erase``
again after the kernel's wait and before the withdrawal's write; the erasure that
follows the write waits for the views once more (``erase_captures``) and is not decided
again. Its Left feared that a refusal there would leave the consent withdrawn with
erase requested and nothing erased. What happens is read here, whole: the withdrawal
was decided and written, so its erasure is the subject's now and is finished, with its
receipt, as a request finishing its own erasure is (``resume``); nothing is lost. When
that wait runs out instead, the half state it leaves is shown in the privacy center
(bug SP); with the operators denied ``erase`` by then, the app whose consent it was
finishes it (its own collection), the operator is refused.
"""

from __future__ import annotations

import httpx
import pytest

from audit.receipts import RECEIPT_ACTION
from tests.api.conftest import Apps, LiveServer, bearer
from tests.web.conftest import deny_operators, lisbon_item
from tests.web.test_outage_links import _denied_during_the_wait
from tests.web.test_privacy_finish_erasure import stops_once
from uprof.kernel import Uprof


def _actions(kernel: Uprof) -> list[str]:
    kernel.reads.drain()
    return [e.entry["action"] for e in kernel.audit_log.entries()]


def test_erase_denied_during_the_erasures_own_wait_loses_nothing(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The withdrawal is written on a decision taken after the kernel's first wait;
    during the erasure's own wait another process denies operators ``erase``. The
    request finishes what the written withdrawal promised: 200 with a receipt, the
    consent withdrawn, what it collected erased, every request's outcome on the log."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    waited = _denied_during_the_wait(kernel, monkeypatch, "item", "role:operator")
    with httpx.Client(base_url=server.url, timeout=120) as client:  # the child's wait
        withdrawn = client.post(
            "/v1/consents/withdraw",
            headers=bearer(apps.planner_operator),
            json={"subject": "alice", "consent_id": consent_id, "erase": True},
        )
    assert waited == [True], "the erasure never waited for the views"
    assert withdrawn.status_code == 200, withdrawn.text[:300]
    assert withdrawn.json()["erasure"]["receipt"]
    assert kernel.wait_until_caught_up(30)
    profile = kernel.profile("alice")
    assert "Lisbon" not in str(profile)
    (consent,) = profile.consents
    assert consent.withdrawn_at is not None and consent.erase_requested
    actions = _actions(kernel)
    assert actions.count("erasure.requested") == 1
    assert actions.count("projection.purged") == 1
    assert actions.count(RECEIPT_ACTION) == 1


def test_a_wait_that_runs_out_after_the_write_is_finished_by_the_app_not_a_denied_operator(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The erasure's own wait runs out after the withdrawal is written (503: consent
    withdrawn, erase requested, nothing erased), and the operators are denied ``erase``
    before they ask again: the operator's retry is refused (403, nothing erased). The
    subject cannot finish it either: a deployment that denies its operators ``erase``
    issues no privacy-center link and ends the open ones (a link is worth its issuer's
    rights, ``issuer_stands``). The app whose consent it was finishes it (erasing its
    own collection asks no policy), with the receipt."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    status = stops_once(kernel, monkeypatch, "never-began")
    body = {"subject": "alice", "consent_id": consent_id, "erase": True}
    stopped = http.post("/v1/consents/withdraw", headers=bearer(apps.planner_operator), json=body)
    assert stopped.status_code == status, stopped.text[:300]
    assert kernel.wait_until_caught_up(30)
    assert kernel.consent_erasures_unfinished("alice") == frozenset({consent_id})
    deny_operators(kernel, "erase", "erasure")
    refused = http.post("/v1/consents/withdraw", headers=bearer(apps.planner_operator), json=body)
    assert refused.status_code == 403, refused.text[:300]
    no_link = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": "alice"}
    )
    assert no_link.status_code == 403, no_link.text[:300]
    assert "Lisbon" in str(kernel.profile("alice"))
    finished = http.post("/v1/consents/withdraw", headers=bearer(apps.planner), json=body)
    assert finished.status_code == 200, finished.text[:300]
    assert finished.json()["erasure"]["receipt"]
    assert kernel.wait_until_caught_up(30)
    assert "Lisbon" not in str(kernel.profile("alice"))
    assert kernel.consent_erasures_unfinished("alice") == frozenset()
    assert _actions(kernel).count(RECEIPT_ACTION) == 1
