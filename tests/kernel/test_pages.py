"""Paged lists (uprof.services.paging) through the facade, on SQLite and PostgreSQL.

Each walk writes between pages: every item that existed before the walk must come back
exactly once, and nothing twice. Cursors are attacked: garbage, one altered byte, a cursor
replayed by another app, for another subject, with other filters; and the authorization is
re-checked on every page (a principal that loses its right mid-walk is refused).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from domain.errors import InvalidInputError, PermissionDeniedError
from domain.principal import Principal, PrincipalKind
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, say
from uprof.facade import Facade, Page
from uprof.kernel import Uprof
from uprof.services.paging import MAX_PAGE_LIMIT

TENANT = "default"
PLANNER = Principal(TENANT, "app:planner", "k1", PrincipalKind.APP, frozenset({"app"}))
CALENDAR = Principal(TENANT, "app:calendar", "k2", PrincipalKind.APP, frozenset({"app"}))
COMPLIANCE = Principal(TENANT, "app:compliance-console", "k5", PrincipalKind.APP)
ROGUE = Principal(TENANT, "app:rogue", "k3", PrincipalKind.APP, frozenset({"app"}))
OPERATOR = Principal.local_operator(TENANT)


def door(kernel: Uprof, principal: Principal = OPERATOR) -> Facade:
    return Facade(kernel, principal)


def walk(
    fetch: Callable[[str | None], Page[Any]],
    key: Callable[[Any], Any],
    between: Callable[[int], None] = lambda _: None,
) -> list[Any]:
    """Every key of every page, calling ``between(page_number)`` before each next page."""
    seen: list[Any] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = fetch(cursor)
        seen.extend(key(item) for item in page.items)
        pages += 1
        assert pages < 200, "the walk does not end"
        if page.next_cursor is None:
            return seen
        between(pages)
        cursor = page.next_cursor


def _grant(kernel: Uprof, clock: FakeClock, subject: str, app: str = "app:planner") -> str:
    clock.advance(seconds=1)
    return consent(kernel, subject=subject, app=app)


def test_consent_pages_cover_every_consent_once_while_consents_are_granted(
    kernel: Uprof, clock: FakeClock
) -> None:
    before = {_grant(kernel, clock, "alice") for _ in range(7)}
    planner = door(kernel, PLANNER)
    added: list[str] = []

    def grant_more(_: int) -> None:
        added.append(_grant(kernel, clock, "alice"))
        added.append(_grant(kernel, clock, "alice", app="app:calendar"))  # not planner's

    seen = walk(
        lambda c: planner.list_consents("alice", cursor=c, limit=2),
        lambda item: item.consent_id,
        grant_more,
    )
    assert len(seen) == len(set(seen)), "a consent came back twice"
    assert before <= set(seen), "a consent that was there all along was skipped"
    calendar_ids = {
        c.consent_id for c in door(kernel).consents("alice") if c.app_id != PLANNER.app_id
    }
    assert not calendar_ids & set(seen), "another app's consent leaked into the pages"


def test_memory_pages_cover_every_memory_once_while_captures_arrive(
    kernel: Uprof, clock: FakeClock
) -> None:
    consent(kernel)
    for day in range(1, 10):
        kernel.capture("alice", say(f"memory number {day}", day=day))
    kernel.process()
    before = {m.item_id for m in kernel.profile("alice").memories}
    assert len(before) == 9

    def capture_more(page: int) -> None:
        # One before every position already shown and one after: neither may repeat an item.
        kernel.capture("alice", say(f"early {page}", day=1))
        kernel.capture("alice", say(f"late {page}", day=20 + page))

    seen = walk(
        lambda c: door(kernel).list_memories("alice", cursor=c, limit=4),
        lambda m: m.item_id,
        capture_more,
    )
    assert len(seen) == len(set(seen))
    assert before <= set(seen)


def test_audit_pages_cover_every_entry_once_while_the_log_grows(kernel: Uprof) -> None:
    consent(kernel)
    for i in range(5):
        kernel.capture("alice", say(f"entry {i}"))
    before = [e.leaf_index for e in kernel.audit_entries()]
    seen = walk(
        lambda c: door(kernel).list_audit_entries(cursor=c, limit=3),
        lambda e: e.leaf_index,
        lambda _: kernel.capture("alice", say("written between pages")),
    )
    assert seen == sorted(set(seen)), "leaf order, each once"
    assert set(before) <= set(seen)


def test_receipt_pages_list_only_receipts(kernel: Uprof) -> None:
    for name in ("alice", "bob", "carol"):
        consent(kernel, subject=name)
        kernel.erase_subject(name)
    seen = walk(
        lambda c: door(kernel).list_receipts(cursor=c, limit=2),
        lambda e: e.entry["action"],
    )
    assert seen == ["erasure.receipt"] * 3


def test_subject_pages_show_pseudonyms_once_while_subjects_are_created(
    kernel: Uprof, clock: FakeClock
) -> None:
    for i in range(5):
        _grant(kernel, clock, f"subject-{i}")
    before = {door(kernel).audit_subject_ref(f"subject-{i}") for i in range(5)}
    counter = iter(range(100))
    seen = walk(
        lambda c: door(kernel).list_subjects(cursor=c, limit=2),
        lambda s: s.pseudonym,
        lambda _: _grant(kernel, clock, f"new-{next(counter)}"),
    )
    assert len(seen) == len(set(seen))
    assert before <= set(seen)
    assert all(p.startswith("subj_") for p in seen)


def test_policy_history_pages_in_version_order(kernel: Uprof) -> None:
    operator = door(kernel)
    for category in ("diet", "goal", "language"):
        operator.policy_grant(
            app_id="app:planner", actions=["read"], categories=[category], purpose="scheduling"
        )
    versions = walk(lambda c: operator.list_policy_history(cursor=c, limit=1), lambda c: c.version)
    assert versions == sorted(versions) == [c.version for c in operator.policy_history()]


# ------------------------------------------------------------------------ attacks


def _second_page_cursor(kernel: Uprof, clock: FakeClock) -> str:
    for _ in range(3):
        _grant(kernel, clock, "alice")
    page = door(kernel, PLANNER).list_consents("alice", limit=1)
    assert page.next_cursor is not None
    return page.next_cursor


def _refused_naming_cursor(call: Callable[[], object]) -> None:
    with pytest.raises(InvalidInputError) as refused:
        call()
    assert refused.value.field == "cursor"


def test_a_cursor_from_another_app_is_refused(kernel: Uprof, clock: FakeClock) -> None:
    cursor = _second_page_cursor(kernel, clock)
    _grant(kernel, clock, "alice", app="app:calendar")
    _refused_naming_cursor(lambda: door(kernel, CALENDAR).list_consents("alice", cursor=cursor))


def test_a_cursor_for_another_subject_is_refused(kernel: Uprof, clock: FakeClock) -> None:
    cursor = _second_page_cursor(kernel, clock)
    _grant(kernel, clock, "bob")
    _refused_naming_cursor(lambda: door(kernel, PLANNER).list_consents("bob", cursor=cursor))


def test_a_cursor_for_other_filters_is_refused(kernel: Uprof) -> None:
    consent(kernel)
    for i in range(3):
        kernel.capture("alice", say(f"entry {i}"))
    page = door(kernel).list_audit_entries(action="capture.accepted", limit=1)
    assert page.next_cursor is not None
    _refused_naming_cursor(
        lambda: door(kernel).list_audit_entries(action="consent.granted", cursor=page.next_cursor)
    )
    _refused_naming_cursor(lambda: door(kernel).list_audit_entries(cursor=page.next_cursor))
    # The same cursor as another list (receipts share the entries' key) is refused too.
    _refused_naming_cursor(lambda: door(kernel).list_receipts(cursor=page.next_cursor))


@pytest.mark.parametrize(
    "forge",
    [
        lambda c: "not-a-cursor",
        lambda c: c[:-1] + ("A" if c[-1] != "A" else "B"),  # tag's last character
        lambda c: c[:-1] + chr(ord(c[-1]) ^ 1),  # only its spare low bits, maybe
        lambda c: c.split(".")[0] + ".WzBd." + c.split(".")[2],  # position swapped
        lambda c: c + ".extra",
        lambda c: "c1." + "A" * 600,
        lambda c: "c2" + c[2:],
    ],
    ids=["garbage", "tag", "tag-low-bits", "position", "extra", "long", "version"],
)
def test_an_altered_cursor_is_refused(
    kernel: Uprof, clock: FakeClock, forge: Callable[[str], str]
) -> None:
    cursor = _second_page_cursor(kernel, clock)
    _refused_naming_cursor(
        lambda: door(kernel, PLANNER).list_consents("alice", cursor=forge(cursor))
    )


def test_a_cursor_cannot_widen_an_apps_view(kernel: Uprof, clock: FakeClock) -> None:
    """The operator's cursor over all apps' consents, replayed by an app, is refused."""
    for app in ("app:planner", "app:calendar", "app:planner"):
        _grant(kernel, clock, "alice", app=app)
    page = door(kernel).list_consents("alice", limit=1)
    assert page.next_cursor is not None
    _refused_naming_cursor(
        lambda: door(kernel, PLANNER).list_consents("alice", cursor=page.next_cursor)
    )


def test_authorization_is_checked_again_on_every_page(kernel: Uprof) -> None:
    consent(kernel)
    for i in range(3):
        kernel.capture("alice", say(f"entry {i}"))
    compliance = door(kernel, COMPLIANCE)
    first = compliance.list_audit_entries(limit=1)
    assert first.next_cursor is not None
    door(kernel).policy_revoke(app_id=COMPLIANCE.app_id, role="role:compliance")
    with pytest.raises(PermissionDeniedError):
        compliance.list_audit_entries(cursor=first.next_cursor, limit=1)
    # And an app that never had the right is refused before its cursor is even read.
    with pytest.raises(PermissionDeniedError):
        door(kernel, ROGUE).list_audit_entries(cursor=first.next_cursor)


@pytest.mark.parametrize("limit", [0, -1, MAX_PAGE_LIMIT + 1])
def test_a_limit_out_of_range_is_refused_naming_limit(kernel: Uprof, limit: int) -> None:
    consent(kernel)
    with pytest.raises(InvalidInputError) as refused:
        door(kernel, PLANNER).list_consents("alice", limit=limit)
    assert refused.value.field == "limit"


def test_the_last_page_has_no_cursor(kernel: Uprof, clock: FakeClock) -> None:
    for _ in range(2):
        _grant(kernel, clock, "alice")
    assert door(kernel, PLANNER).list_consents("alice", limit=2).next_cursor is None
    exact = door(kernel, PLANNER).list_consents("alice", limit=1)
    assert exact.next_cursor is not None
    last = door(kernel, PLANNER).list_consents("alice", cursor=exact.next_cursor, limit=1)
    assert len(last.items) == 1 and last.next_cursor is None


def test_every_single_character_change_of_a_cursor_is_refused(
    kernel: Uprof, clock: FakeClock
) -> None:
    """Exhaustive over one cursor: each position, each other base64url character, opened
    under the very listing the facade binds this page to; and through the whole facade
    call for one change at each position (each facade call authorizes and audits, so the
    exhaustive set goes through the codec that call uses)."""
    cursor = _second_page_cursor(kernel, clock)
    planner = door(kernel, PLANNER)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
    forged = [
        [cursor[:i] + other + cursor[i + 1 :] for other in alphabet if other != original]
        for i, original in enumerate(cursor)
    ]
    listing = planner._listing(
        "consents",
        ("time", "str"),
        subject=kernel.stream_of("alice"),
        app=planner.principal.policy_subject,
    )
    assert planner._open(listing, cursor) is not None  # the listing is the page's own
    accepted = []
    for i, at_position in enumerate(forged):
        for bad in at_position:
            try:
                planner._open(listing, bad)
            except InvalidInputError as refused:
                assert refused.field == "cursor"
            else:
                accepted.append(bad)
        try:
            planner.list_consents("alice", cursor=at_position[i % len(at_position)], limit=1)
        except InvalidInputError as refused:
            assert refused.field == "cursor"
        else:
            accepted.append(at_position[i % len(at_position)])
    assert accepted == []


def test_cursors_outlive_the_process_that_issued_them(backend, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
    """Several servers share a deployment: a cursor from one is good on the next."""
    from tests.kernel.conftest import build_kernel, settings_for

    first = build_kernel(settings_for(backend), clock)
    try:
        cursor = _second_page_cursor(first, clock)
    finally:
        first.close()
    second = build_kernel(settings_for(backend), clock)
    try:
        page = door(second, PLANNER).list_consents("alice", cursor=cursor, limit=5)
        assert len(page.items) == 2
    finally:
        second.close()
