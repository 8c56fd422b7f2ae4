"""The policy store is sealed like the profile log (decision 0140-sealed-policy-store):
a policy row forged, altered, moved, cut from the tail, or an older policy store put
back, is damage; every policy check then denies, naming the policy store, instead of
granting what the stores were made to say (bugs HA, HB; SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from domain.principal import Principal
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.policy_rows import (
    copy_policy_store,
    delete_policy_rows_from,
    forged_change,
    insert_policy_row,
    policy_rows,
    put_policy_store_back,
    set_policy_row,
)
from uprof.facade import Facade
from uprof.services.policy import POLICY_STORE_DAMAGED
from uprof.settings import Settings

APP = "app:planner"
INTRUDER = "app:intruder"
DAMAGED = "stored_data_damaged"


def _decide(
    settings: Settings, clock: FakeClock, app: str, category: str = "diet"
) -> tuple[bool, str]:
    """One fresh start's decision (a process started after the attack), and its reason;
    a damaged store is also audited (``policy.store_damaged``) and shown by ``/readyz``."""
    with running(settings, clock) as k:
        d = k.authorizer.decide(
            app_id=app,
            tenant=k.subjects.tenant,
            action="read",
            category=category,
            purpose="personalization",
        )
        if DAMAGED in d.reason:
            assert list(k.audit_log.entries(action=POLICY_STORE_DAMAGED)), "not audited"
            assert DAMAGED in k.policy.health()
        return d.allowed, d.reason


def _assert_refused(settings: Settings, clock: FakeClock, app: str) -> None:
    allowed, reason = _decide(settings, clock, app)
    assert not allowed, f"{app} was served from a damaged policy store"
    assert DAMAGED in reason and "policy store" in reason, reason


def _grant_intruder_row(settings: Settings, clock: FakeClock) -> tuple[int, str, bytes]:
    with running(settings, clock) as k:
        return forged_change(
            k.policy.app,
            k.subjects.tenant,
            lambda p: p.add_rule(
                [INTRUDER, k.subjects.tenant, "read", "diet", "personalization", "allow"],
                "operator:local#cli",
            ),
        )


def test_a_forged_policy_row_does_not_grant(backend: Backend, clock: FakeClock) -> None:
    """HA: a writer of the stores appends a ``RuleAdded`` granting an app of theirs
    ``read diet``; on main the next start served it."""
    settings = settings_for(backend)
    assert not _decide(settings, clock, INTRUDER)[0]
    version, topic, state = _grant_intruder_row(settings, clock)
    insert_policy_row(backend, settings, version, topic, state)
    _assert_refused(settings, clock, INTRUDER)


def test_an_altered_policy_row_does_not_grant(backend: Backend, clock: FakeClock) -> None:
    """HA: a genuine ``RuleAdded`` for the planner, its subject rewritten to the intruder."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_grant(
            app_id=APP, actions=["read"], categories=["health"], purpose="personalization"
        )
    version, topic, state = policy_rows(backend, settings)[-1]
    assert b"app:planner" in state
    set_policy_row(
        backend, settings, version, topic, state.replace(b"app:planner", INTRUDER.encode())
    )
    _assert_refused(settings, clock, INTRUDER)


def test_a_policy_row_moved_to_another_version_does_not_grant(
    backend: Backend, clock: FakeClock
) -> None:
    """HA: a genuine grant (revoked since) copied over the revocation's row."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        f = Facade(k, Principal.local_operator(k.subjects.tenant))
        f.policy_grant(
            app_id=APP, actions=["read"], categories=["health"], purpose="personalization"
        )
        f.policy_revoke(
            app_id=APP, actions=["read"], categories=["health"], purpose="personalization"
        )
    rows = policy_rows(backend, settings)
    (_, granted_t, granted), (revoked_v, _, _) = rows[-2], rows[-1]
    set_policy_row(backend, settings, revoked_v, granted_t, granted)
    allowed, reason = _decide(settings, clock, APP, "health")
    assert not allowed
    assert DAMAGED in reason and "policy store" in reason, reason


def test_a_revocation_cut_from_the_tail_is_detected(backend: Backend, clock: FakeClock) -> None:
    """HB: the planner's role revoked, then the revocation's row deleted; on main the next
    start served the planner again."""
    settings = settings_for(backend)
    assert _decide(settings, clock, APP)[0]
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_revoke(
            app_id=APP, role="role:assistant"
        )
    assert not _decide(settings, clock, APP)[0]
    delete_policy_rows_from(backend, settings, policy_rows(backend, settings)[-1][0])
    _assert_refused(settings, clock, APP)


def test_an_older_policy_store_put_back_is_detected(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """HB: a copy of ``policies.sqlite`` (PostgreSQL: of the policy rows) taken before a
    revocation, put back after it."""
    settings = settings_for(backend)
    assert _decide(settings, clock, APP)[0]
    copy_policy_store(backend, settings, tmp_path / "old")
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_revoke(
            app_id=APP, role="role:assistant"
        )
    put_policy_store_back(backend, settings, tmp_path / "old")
    _assert_refused(settings, clock, APP)
