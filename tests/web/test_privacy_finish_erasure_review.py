"""0211-console-and-center-finish's "Finish erasure" attacked (0216-review-of-0211-to-0214,
a live server on both backends): the form posted from a stale page after the erasure
finished and without its CSRF token held (one receipt; refused, nothing erased). Posted
twice at once (a double click) it gave two receipts (bug TF: 2 of 2 fail on main at
077287a0, one per backend; one erasing withdrawal of a consent at a time since)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer
from tests.web.conftest import lisbon_item, privacy_link, signed_in
from tests.web.test_privacy_finish_erasure import (
    _receipts,
    _stopped_half_way,
    _withdraw_form,
)
from uprof.kernel import Uprof


class HalfWay(NamedTuple):
    user: httpx.Client
    consent_id: str
    form: dict[str, str]
    receipts: int


@contextlib.contextmanager
def _half_way(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[HalfWay]:
    """Alice withdraws her consent with erase from her page and the erasure stops before
    it began; for the block: her signed-in browser, the consent, the finish form her page
    then offers, and the receipts counted then."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    with signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as user:
        _stopped_half_way(user, kernel, consent_id, "never-began", monkeypatch)
        page = user.get("/privacy")
        assert "erasure not finished" in page.text
        yield HalfWay(user, consent_id, _withdraw_form(page.text, consent_id), _receipts(kernel))


def test_held_the_stale_pages_finish_after_the_erasure_finished_gives_no_second_receipt(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _half_way(server, http, apps, kernel, monkeypatch) as (user, _, form, receipts):
        first = user.post("/privacy/consents/withdraw", data=form, follow_redirects=False)
        assert first.status_code == 303, first.text[-300:]
        assert kernel.wait_until_caught_up(30)
        again = user.post("/privacy/consents/withdraw", data=form, follow_redirects=False)
        assert again.status_code in (303, 409), again.text[-300:]
        assert kernel.wait_until_caught_up(30)
    assert _receipts(kernel) == receipts + 1
    assert kernel.consent_erasures_unfinished("alice") == frozenset()


def test_tf_two_finishes_at_once_give_one_receipt(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _half_way(server, http, apps, kernel, monkeypatch) as (user, _, form, receipts):
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(
                    lambda _: user.post(
                        "/privacy/consents/withdraw", data=form, follow_redirects=False
                    ),
                    range(2),
                )
            )
        assert kernel.wait_until_caught_up(30)
    assert all(a.status_code in (303, 409, 429) for a in answers), [
        (a.status_code, a.text[-200:]) for a in answers
    ]
    assert any(a.status_code == 303 for a in answers)
    assert _receipts(kernel) == receipts + 1
    assert "Lisbon" not in str(kernel.profile("alice"))


def test_held_the_finish_without_its_csrf_token_erases_nothing(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _half_way(server, http, apps, kernel, monkeypatch) as (user, consent_id, form, receipts):
        forged = {k: v for k, v in form.items() if k != "csrf"}
        refused = user.post("/privacy/consents/withdraw", data=forged, follow_redirects=False)
        assert refused.status_code == 403, refused.text[-300:]
        wrong = user.post(
            "/privacy/consents/withdraw",
            data=forged | {"csrf": "not-the-token"},
            follow_redirects=False,
        )
        assert wrong.status_code == 403, wrong.text[-300:]
        assert kernel.wait_until_caught_up(30)
    assert _receipts(kernel) == receipts
    assert kernel.consent_erasures_unfinished("alice") != frozenset()
    assert consent_id in str(kernel.consent_erasures_unfinished("alice"))
