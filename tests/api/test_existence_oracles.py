"""An app that holds no consent of a subject learns nothing of it, on every route, however
the request is put together and however far behind the pipeline is (decision 0057).

Found in a hostile-caller review (2026-12-05), each tried over REST on the code before
the fix, where both failed:

- a slice naming a subject *and* one of the app's own sessions (or identifiers) bound to
  another subject answered ``422 identity_unresolved`` ("ambiguous identity") when the
  named subject existed and ``404 subject_not_found`` when it did not: the subject index
  was asked before anything about the app's consent;
- with the views behind (workers down or busy), the consent list, session and identifier
  binding, proposals and withdrawals waited for the subject's views *before* asking
  whether the app held a consent of it: ``503 read_timeout`` after the wait bound for a
  subject that exists, ``404`` at once for one that does not.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from domain.principal import Principal, PrincipalKind
from tests.api.conftest import PLANNER, Apps, api_settings, bearer, grant, interaction
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel as build_embedded_kernel
from tests.kernel.conftest import settings_for
from uprof.facade import Facade
from uprof.kernel import Uprof
from uprof.settings import Settings


def build_embedded(backend: Backend) -> Uprof:
    return build_embedded_kernel(settings_for(backend), FakeClock())


def _slice(http: httpx.Client, key: str, **names: str) -> httpx.Response:
    return http.post(
        "/v1/slices",
        headers=bearer(key),
        json={
            **names,
            "query": "what to cook",
            "budget_tokens": 200,
            "purpose": "scheduling",
            "agent_id": "agent:one",
        },
    )


def _answer(response: httpx.Response) -> tuple[int, Any]:
    return response.status_code, response.json()["error"]


def test_naming_a_subject_beside_the_apps_own_session_tells_nothing_of_it(
    http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner, "alice")  # alice exists; the calendar holds no consent of her
    grant(http, apps.calendar, "bob", purposes=("scheduling",))
    for path, field, value in (
        ("/v1/sessions", "session_id", "session-1"),
        ("/v1/identifiers", "identifier", "bob@example.com"),
    ):
        bound = http.post(
            path, headers=bearer(apps.calendar), json={field: value, "subject": "bob"}
        )
        assert bound.status_code == 201, bound.text
        known, unknown = (
            _answer(_slice(http, apps.calendar, subject=s, **{field: value}))
            for s in ("alice", "nobody")
        )
        assert unknown[0] == 404 and known == unknown, field

    # Guard: an app holding a consent of both is told that its names disagree.
    grant(http, apps.calendar, "alice", purposes=("scheduling",))
    both = _slice(http, apps.calendar, subject="alice", session_id="session-1")
    assert both.status_code == 422, both.text
    assert both.json()["error"]["code"] == "identity_unresolved"


class TestBehindViews:
    """The pipeline stands still (``run_worker`` off), so a subject's views stay behind
    its newest write for the whole test."""

    @pytest.fixture
    def settings(self, backend: Backend) -> Settings:
        return api_settings(backend, background=True).model_copy(
            update={"run_worker": False, "read_wait_timeout_s": 0.3}
        )

    def test_a_subject_behind_in_the_views_is_unknown_to_an_app_without_its_consent(
        self, http: httpx.Client, apps: Apps
    ) -> None:
        grant(http, apps.planner, "alice")
        captured = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction("I am vegetarian")},
        )
        assert captured.status_code == 201, captured.text
        calendar = bearer(apps.calendar)
        requests: list[tuple[str, dict[str, Any]]] = [
            ("/v1/consents/list", {}),
            ("/v1/sessions", {"session_id": "session-2"}),
            ("/v1/identifiers", {"identifier": "alice@example.com"}),
            ("/v1/consents/withdraw", {"consent_id": "0" * 32}),
            ("/v1/consents/withdraw", {"consent_id": "0" * 32, "erase": True}),
            (
                "/v1/proposals",
                {
                    "agent_id": "agent:one",
                    "purpose": "scheduling",
                    "proposals": [
                        {"kind": "memory", "text": "likes mornings", "category": "schedule"}
                    ],
                },
            ),
        ]
        for path, body in requests:
            known, unknown = (
                _answer(http.post(path, headers=calendar, json={"subject": s, **body}))
                for s in ("alice", "nobody")
            )
            assert unknown[0] == 404 and known == unknown, (path, body)

    def test_an_app_that_withdrew_its_consent_before_the_views_had_it_still_knows_it(
        self, http: httpx.Client, apps: Apps
    ) -> None:
        """Guard: a consent granted and withdrawn while the views lag is neither in them
        nor in force; the app is still told about its own (the audit log's
        ``consent.granted``): its proposal is refused for consent (403), not as for an
        unknown subject (a first version of this change answered 404)."""
        consent_id = grant(http, apps.calendar, "dora", purposes=("scheduling",))
        withdrawn = http.post(
            "/v1/consents/withdraw",
            headers=bearer(apps.calendar),
            json={"subject": "dora", "consent_id": consent_id},
        )
        assert withdrawn.status_code == 200, withdrawn.text
        proposed = http.post(
            "/v1/proposals",
            headers=bearer(apps.calendar),
            json={
                "subject": "dora",
                "agent_id": "agent:one",
                "purpose": "scheduling",
                "proposals": [{"kind": "memory", "text": "likes mornings", "category": "schedule"}],
            },
        )
        assert proposed.status_code == 403, proposed.text
        assert proposed.json()["error"]["code"] == "consent_required"

    def test_an_app_binds_a_session_under_a_consent_not_yet_in_the_views(
        self, http: httpx.Client, apps: Apps
    ) -> None:
        """Whether the app holds a consent is read from the subject's stream when the
        views lag, so a binding needs no view (before: 503 read_timeout after the wait)."""
        grant(http, apps.calendar, "carol", purposes=("scheduling",))
        bound = http.post(
            "/v1/sessions",
            headers=bearer(apps.calendar),
            json={"session_id": "session-3", "subject": "carol"},
        )
        assert bound.status_code == 201, bound.text


def test_an_embedded_app_lists_a_consent_it_granted_and_withdrew_before_any_processing(
    backend: Backend,
) -> None:
    """Guard for the embedded kernel (no workers), whose reads bring the views up to date
    inline: the consent check reads the views, so it brings them up to date first, as the
    check it replaced did; an app's own withdrawn consent is found though nothing ran."""
    kernel = build_embedded(backend)
    try:
        door = Facade(kernel, Principal(kernel.subjects.tenant, PLANNER, "k", PrincipalKind.APP))
        consent_id = door.grant_consent(
            "alice", categories=["diet"], purposes=["personalization"], collected_by="ui:1"
        )
        door.withdraw_consent("alice", consent_id)
        listed = door.list_consents("alice")
    finally:
        kernel.close()
    assert [c.consent_id for c in listed.items] == [consent_id]
    assert listed.items[0].withdrawn_at is not None
