"""Review of decisions 0174, 0176 and 0177 (reviews that were not reviewed in turn), as an
outside attacker, on SQLite and PostgreSQL: the web and door side. Each bug's test failed
on main before its fix; the attacks that held are kept too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from domain.errors import InvalidInputError
from domain.principal import Principal
from tests.api.conftest import Apps, LiveServer, grant
from tests.conftest import Backend
from tests.web.conftest import link_token, open_link, policy_store_down, privacy_link
from uprof.facade import Facade
from uprof.kernel import Uprof


@pytest.mark.parametrize("term", ["Zq7\x00", "\x00", "Zq7\udcff"])
def test_mw_a_residue_term_that_is_not_text_is_refused_naming_it(kernel: Uprof, term: str) -> None:
    """Bug MW (0176's ME refused a blank term, not one no store can look for). A term
    holding a NUL character crashed the PostgreSQL scan (``psycopg.DataError``: text
    cannot contain NUL), a 500 from the console; a lone surrogate (what Python makes of a
    byte that is not UTF-8 in a command line: ``uprof audit residue --term $'\\xff'``)
    failed the file scan on both backends ("the file scan failed ... surrogates not
    allowed"), naming no field. The door refuses both as it refuses a blank term: 422 /
    exit 2, naming ``terms`` and its place, before anything is read."""
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    with pytest.raises(InvalidInputError) as refused:
        door.residue_scan(["Zq7-never-said", term])
    assert refused.value.field == "terms"
    assert "terms[1]" in str(refused.value)


@pytest.mark.parametrize("term", ["\u200b", "\ufeff", "\u00a0Zq7"])
def test_a_residue_term_of_invisible_characters_is_looked_for(kernel: Uprof, term: str) -> None:
    """Held (ME): a term that is not blank to ``str.strip`` (a zero-width space, a BOM)
    or holds a no-break space is text a store may hold: it is looked for, and an empty
    store holds none of it (no term normalises to blank: the scan only adds its lower
    and upper case)."""
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    report = door.residue_scan([term])
    assert report.clean, report.findings[:3]


def test_mw_the_console_refuses_a_nul_term_as_bad_input(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    """Bug MW through the console: a NUL in the residue form (``%00``) answered 500 on
    PostgreSQL; now 422, the form keeps what was typed."""
    from tests.web.conftest import csrf_of

    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/receipts").text)
        refused = console.post("/console/residue", data={"csrf": csrf, "terms": "Zq7\nZq8\x00"})
        assert refused.status_code == 422, refused.text[-300:]
        assert "terms[1]" in refused.text


def _sign_in(url: str, token: str, go: Any, out: Any, times: int) -> None:
    """A browser in its own process pressing "Sign in" ``times`` with one link's token,
    once ``go`` is set; puts each answer's status and Retry-After."""
    assert go.wait(60)
    with httpx.Client(base_url=url, timeout=60) as browser:
        for _ in range(times):
            answer = browser.post("/privacy/login", data={"token": token})
            out.put((answer.status_code, answer.headers.get("Retry-After")))


def _race(url: str, token: str, *, browsers: int = 2, times: int = 1) -> list[tuple[Any, ...]]:
    from tests import children

    go, out = children.CONTEXT.Event(), children.CONTEXT.Queue()
    racers = [
        children.CONTEXT.Process(target=_sign_in, args=(url, token, go, out, times))
        for _ in range(browsers)
    ]
    for racer in racers:
        racer.start()
    go.set()
    answers = [out.get(timeout=120) for _ in range(browsers * times)]
    for racer in racers:
        racer.join(60)
        assert racer.exitcode == 0
    return sorted(answers, key=str)


def test_a_link_given_back_in_an_outage_still_opens_one_session_raced(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Held (0176, MG's give-back): browsers in two real processes press "Sign in" with
    one link at once, three times each, while the policy store cannot be read: every
    answer is a refusal to retry (with Retry-After), none a session, and the link is not
    spent; once the store answers, the same race opens exactly one session. Bug NW: a
    press while the other browser's press held the link (redeemed, not yet given back)
    was told "Link not valid" (403), though the link was not spent (the final CI saw 1 of
    6 answers so; ``test_sign_in_link_held.py`` holds it deterministically): now 409
    "in use", never 403 for a link not spent. Given back with its own expiry."""
    from domain.errors import SignInLinkInUseError
    from uprof.web.state import LinkStore

    grant(http, apps.planner)
    token = link_token(http, privacy_link(http, apps.planner_operator, "alice"))
    with policy_store_down(backend, kernel):
        during = _race(server.url, token, times=3)
    # The outage's answer (503), or "in use" (409) while the other browser's press holds
    # the link: both say retry; no press is told the unspent link is dead.
    assert all(status in (503, 409) and int(wait) > 0 for status, wait in during), during
    assert any(status == 503 for status, _ in during), during
    # Exactly one session; the other browser is told the link is spent (403) or, while
    # the winner's sign-in still holds it, in use (409).
    after = [status for status, _ in _race(server.url, token)]
    assert after in ([303, 403], [303, 409]), after
    assert [status for status, _ in _race(server.url, token, browsers=1)] == [403]

    links = LinkStore()
    issued, expires_at, _ = links.issue("alice")
    redeemed = links.redeem(issued)
    assert redeemed is not None and redeemed.expires_at == expires_at
    links.give_back(issued, redeemed)
    again = links.redeem(issued)
    assert again is not None and again.expires_at == expires_at  # not extended
    with pytest.raises(SignInLinkInUseError):
        links.redeem(issued)  # held by ``again``: in use, not a second redemption
    links.spend(issued)
    assert links.redeem(issued) is None  # single-use still
    other, _, _ = links.issue("alice")
    held = links.redeem(other)
    assert held is not None
    gone = held._replace(expires_at=datetime.now(UTC) - timedelta(seconds=1))
    links.give_back(other, gone)  # expired meanwhile: not put back
    assert links.redeem(other) is None


def test_my_a_damaged_policy_store_is_named_as_damage_in_the_privacy_center(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug MY: the link's check (0173, 0176's MH) took every problem the policy's health
    named for an outage: a damaged policy store (a revocation's row cut from its tail,
    decision 0140) made every privacy-center page, and a sign-in, 503
    ``policy_store_unavailable`` with ``Retry-After: 5``, a wait to retry, while the
    store is damage an operator must repair (docs/security.md: ``stored_data_damaged``,
    500 where it surfaces; retrying changes nothing). Now the pages and the sign-in name
    the damage (500 ``stored_data_damaged``, no ``Retry-After``); the session is kept and
    the link not spent (not the policy's refusal), and both serve again once repaired."""
    from tests.kernel.policy_rows import delete_policy_rows_from, insert_policy_row, policy_rows

    grant(http, apps.planner)
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    later = link_token(http, privacy_link(http, apps.planner_operator, "alice"))
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        open_link(browser, privacy_link(http, apps.planner_operator, "alice"))
        assert browser.get("/privacy/export.json").status_code == 200
        door.policy_revoke(app_id="app:calendar", role="role:scheduler")
        version, topic, state = policy_rows(backend, kernel.settings)[-1]
        delete_policy_rows_from(backend, kernel.settings, version)  # the revocation cut
        try:
            assert "damaged" in kernel.policy_health()
            refused = [
                browser.get("/privacy/export.json"),
                browser.get("/privacy"),
                httpx.post(f"{server.url}/privacy/login", data={"token": later}, timeout=30),
            ]
            for page in refused:
                shown = (page.status_code, page.headers.get("Retry-After"))
                assert shown == (500, None), (shown, page.text[:300])
                assert "damaged" in page.text, page.text[:300]
        finally:
            insert_policy_row(backend, kernel.settings, version, topic, state)
        assert kernel.policy_health() == ""
        assert browser.get("/privacy/export.json").status_code == 200  # the session kept
    with httpx.Client(base_url=server.url, timeout=30) as other:
        assert other.post("/privacy/login", data={"token": later}).status_code == 303
