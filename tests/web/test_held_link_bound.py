"""A held sign-in link and the link store's bound (bug PW; decision 0193's Left).

The link store keeps at most ``MAX_LINKS`` (10,000) links and voids the oldest past it. A
link held by a sign-in (redeemed, not decided) was voided like any other: a press beside
it was told "Link not valid", and when the holder then gave the link back (an outage
stopped it, review of 0173 bug MG) ``give_back`` put it back, and the next press opened a
session with the link that press had been told was dead. Now the bound voids only links
nobody holds: while held a link is "in use" (bug NW), and the holder alone spends it or
gives it back. On SQLite and PostgreSQL against a live server; the flood of links is
issued while the sign-in is stopped at its hook (``first_sign_in_held``), never raced.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from domain.errors import SignInLinkInUseError
from tests.api.conftest import Apps, LiveServer
from tests.conftest import Backend
from tests.web.conftest import policy_store_down
from tests.web.test_sign_in_link_held import (
    _alices_link,
    _in_use,
    _press,
    _spent_by_one_session,
    _used_entries,
    first_sign_in_held,
)
from uprof.kernel import Uprof
from uprof.web.state import MAX_LINKS, LinkStore


def _flood(links: LinkStore, count: int) -> None:
    """``count`` more links issued (an operator's, or a hostile key's, many asks)."""
    for i in range(count):
        links.issue(f"flood-{i}")


def test_pw_a_link_held_past_the_bound_is_in_use_then_opens_its_one_session(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PW: the first press holds the link and an outage (the policy store) will stop it;
    meanwhile 10,000 more links are issued. The press beside it is "in use, retry" (on
    main: "Link not valid", the link voided by the bound), the holder gives the link back
    (503), and after the outage the link opens exactly one session: no press told "not
    valid" is contradicted (on main the later press opened a session)."""
    token, link_id = _alices_link(http, apps, kernel)
    stores: list[LinkStore] = []
    real_redeem = LinkStore.redeem

    def redeem(self: LinkStore, token: str) -> object:
        stores.append(self)  # the serving app's store, to issue the flood into
        return real_redeem(self, token)

    monkeypatch.setattr(LinkStore, "redeem", redeem)
    with policy_store_down(backend, kernel):
        with (
            ThreadPoolExecutor(max_workers=1) as pool,
            first_sign_in_held(monkeypatch) as (held, release),
        ):
            first = pool.submit(_press, server.url, token)
            assert held.wait(120), "the first sign-in never reached its check"
            _flood(stores[0], MAX_LINKS)
            second = _press(server.url, token)
            release.set()
            given_back = first.result(timeout=180)
    assert given_back.status_code == 503, given_back.text[-600:]
    with httpx.Client(base_url=server.url, timeout=120) as browser:
        after = _press(server.url, token, browser)
    told_dead = second.status_code == 403 and "Link not valid" in second.text
    assert not (told_dead and after.status_code == 303), (
        "a press was told 'Link not valid', then the link opened a session"
    )
    _in_use(second)
    assert after.status_code == 303, after.text[-600:]
    _spent_by_one_session(server, kernel, token, link_id)
    assert _used_entries(kernel, link_id) == 1


def test_pw_the_bound_voids_only_links_nobody_holds() -> None:
    """PW on the store alone: a held link survives a flood past the bound and stays in
    use; given back it is valid again, once; the others are still bounded. A link voided
    by the bound is gone for good (a ``give_back`` without a hold revives nothing)."""
    links = LinkStore(max_links=5)
    token = links.issue("alice")[0]
    redeemed = links.redeem(token)
    assert redeemed is not None
    _flood(links, 12)
    assert len(links) <= 5 + 1  # the bound, and the one held link
    with pytest.raises(SignInLinkInUseError):
        links.redeem(token)
    links.give_back(token, redeemed)
    again = links.redeem(token)
    assert again is not None and again.link_id == redeemed.link_id
    links.spend(token)
    assert links.redeem(token) is None
    links.give_back(token, again)  # spent: not held any more, nothing to give back
    assert links.redeem(token) is None

    voided = links.issue("bob")[0]
    unheld = links.redeem(voided)
    assert unheld is not None
    links.spend(voided)
    _flood(links, 12)
    links.give_back(voided, unheld)  # a stray give-back of a link no sign-in holds
    assert links.redeem(voided) is None
