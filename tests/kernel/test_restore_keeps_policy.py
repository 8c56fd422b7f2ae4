"""A restore from a backup keeps the policy in force, as it keeps API keys and sign-outs
(SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from domain.principal import Principal
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from uprof.facade import Facade
from uprof.services.backup import backup, restore

APP = "app:planner"


def _allowed(settings, clock: FakeClock) -> bool:  # type: ignore[no-untyped-def]
    k = build_kernel(settings, clock)
    try:
        return k.authorizer.decide(
            app_id=APP,
            tenant=k.subjects.tenant,
            action="read",
            category="diet",
            purpose="personalization",
        ).allowed
    finally:
        k.close()


def test_a_restore_does_not_bring_a_revoked_right_back(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Until 2026-12-05 a PostgreSQL backup held the policy store's tables (the dump left
    out only the key tables), so a restore put the policy of the backup's time back: an
    app's right revoked after the backup (``uprof policy revoke``) was in force again, and
    the log's ``policy.changed`` entry said it was revoked. SQLite keeps the policy in its
    own file, which a backup does not copy, so a restore there kept the live policy."""
    settings = settings_for(backend)
    assert _allowed(settings, clock)  # the seed lets the planner read diet
    backup(settings, tmp_path / "bk")
    k = build_kernel(settings, clock)
    try:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_revoke(
            app_id=APP, role="role:assistant"
        )
    finally:
        k.close()
    assert not _allowed(settings, clock)

    restore(settings, tmp_path / "bk")

    assert not _allowed(settings, clock)


def test_the_restore_knows_the_policy_store_by_its_name() -> None:
    """The PostgreSQL restore leaves the tables named after the policy store alone."""
    from uprof.backends.postgres import POLICY_STORE_NAME, _names_policy_object
    from uprof.services.policy import PolicyApplication

    assert PolicyApplication.name == POLICY_STORE_NAME
    assert _names_policy_object("242; 1259 19414 TABLE public policies_events postgres")
    assert _names_policy_object(
        "3365; 2606 19421 CONSTRAINT public policies_events policies_events_pkey postgres"
    )
    assert not _names_policy_object("242; 1259 19414 TABLE public profiles_events postgres")
    assert not _names_policy_object(";     Dump of policies_events")


def test_a_restore_into_emptied_data_stores_takes_the_backups_policy(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A disaster took the data stores (the key folder kept): there is no live policy to
    keep, so the backup's is restored, with the right revoked before the backup still
    revoked. On SQLite a backup held no policy until 2026-12-05 (its own file was never
    copied), so such a restore started from the seed policy file and the revoked right
    was granted again."""
    from tests.kernel.test_restore_bad_input import _empty_data_stores

    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    try:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_revoke(
            app_id=APP, role="role:assistant"
        )
    finally:
        k.close()
    backup(settings, tmp_path / "bk")
    _empty_data_stores(backend, settings)

    restore(settings, tmp_path / "bk")

    assert not _allowed(settings, clock)
