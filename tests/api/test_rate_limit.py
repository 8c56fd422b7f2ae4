"""Requests per API key are limited when configured: 429 with Retry-After, nothing written."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.settings import Settings, parse_rate_limit


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_key_over_its_limit_gets_429_and_others_do_not(
    kernel: Uprof, keys: ApiKeyStore, apps: Apps
) -> None:
    grant_key = keys.create("app:planner").token  # its own allowance, for the set-up
    with (
        LiveServer(create_server(kernel, keys, rate_limit="4/minute")) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        grant(http, grant_key)
        statuses = []
        for n in range(6):
            response = http.post(
                "/v1/captures",
                headers=bearer(apps.planner),
                json={"subject": "alice", **interaction(f"I like tea number {n}")},
            )
            statuses.append(response.status_code)
            if n == 3:
                # The pipeline worker extracts the four captures in the background; the
                # answer can come before it has written, so read the log once it is done.
                assert kernel.wait_until_caught_up(30)
                position_after_four = kernel.lag().log_position
        assert statuses == [201, 201, 201, 201, 429, 429]
        assert response.json()["error"]["code"] == "rate_limited"
        # The window is counted in slots of 1/60 of the period, on the safe side: the
        # wait may be one slot (a second of a minute) longer than the period.
        assert 1 <= int(response.headers["Retry-After"]) <= 61
        # Another key (another app) keeps its own allowance.
        other = http.post(
            "/v1/consents/list", headers=bearer(apps.calendar), json={"subject": "alice"}
        )
        assert other.status_code != 429
        # A request without a valid key is refused as unauthenticated and uses up nothing.
        assert http.post("/v1/captures", headers=bearer("upk_bad_key"), json={}).status_code == 401
    # The refused captures wrote nothing to the log.
    assert kernel.wait_until_caught_up(30)
    assert kernel.lag().log_position == position_after_four


def test_no_limit_by_default_and_bad_specs_are_refused_naming_the_field() -> None:
    assert Settings().rate_limit is None
    assert Settings(rate_limit="off").rate_limit is None
    assert [str(i) for i in parse_rate_limit("50/second;1000/minute")] == [
        "50 per 1 second",
        "1000 per 1 minute",
    ]
    with pytest.raises(ValueError, match="rate_limit"):
        Settings(rate_limit="fast")


def test_periods_the_counters_cannot_hold_are_refused_at_startup() -> None:
    """Review of 0115, bug BG: ``limits`` reads "5/0 minutes" as 5 per minute, and a
    period over 2**31 - 1 s ("10/100 years") was accepted, then failed every check on
    PostgreSQL (``rate_limit_slots.period_s`` is a 32-bit integer: "integer out of
    range"), so every request got a 503 ``rate_limit_unavailable``. Both are refused when
    the settings load, naming the field."""
    for spec in ("5/0 minutes", "1/0 second", "10/100 years", "30/minute;10/400 days"):
        with pytest.raises(ValueError, match="rate_limit") as refused:
            Settings(rate_limit=spec)
        assert "period" in str(refused.value), spec
        with pytest.raises(ValueError, match="privacy_rate_limit"):
            Settings(privacy_rate_limit=spec)
    # Still accepted: every period from a second to a year.
    assert Settings(rate_limit="1/second;2/3 seconds;10/365 days").rate_limit
    assert Settings(privacy_rate_limit="1000/year").privacy_rate_limit
