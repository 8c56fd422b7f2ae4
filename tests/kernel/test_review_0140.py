"""Review of decisions 0139 and 0140 (docs/decisions/0143-review-of-0139-0140.md): the
sealed policy store's documented remedy, ``uprof restore``, attacked (SQLite and
PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from domain.principal import Principal
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.policy_rows import (
    copy_policy_store,
    delete_policy_rows_from,
    policy_engine,
    policy_rows,
    put_policy_store_back,
)
from uprof.bootstrap import RestoreInterruptedError
from uprof.facade import Facade
from uprof.services.backup import BackupError, backup, restore
from uprof.settings import Settings

APP = "app:planner"
DAMAGED = "stored_data_damaged"


def _decide(settings: Settings, clock: FakeClock) -> Any:
    with running(settings, clock) as k:
        return k.authorizer.decide(
            app_id=APP,
            tenant=k.subjects.tenant,
            action="read",
            category="diet",
            purpose="personalization",
        )


def _empty_live_policy(backend: Backend, settings: Settings) -> None:
    """The operator path the refusal names: the live policy store moved out of the way
    (SQLite: ``policies.sqlite`` moved aside; PostgreSQL: the ``policies_*`` rows deleted)."""
    if backend.kind == "sqlite":
        live = Path(settings.data_dir) / "policies.sqlite"
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(live) + suffix)
            if p.exists():
                p.rename(str(p) + ".damaged")
        return
    import sqlalchemy as sa

    engine, table, snapshots = policy_engine(backend, settings)
    try:
        with engine.begin() as conn:
            for name in (table, snapshots):
                conn.execute(sa.text(f"DELETE FROM {name}"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("attack", ["cut", "older-store"])
def test_a_restore_does_not_accept_a_revocation_cut_from_the_live_policy(
    backend: Backend, clock: FakeClock, tmp_path: Path, attack: str
) -> None:
    """HS: the planner's role revoked and backed up; then the revocation's row is cut
    from the live policy (HB's attack), which every check now reports as damage, naming
    ``uprof restore`` as the remedy. The restore keeps the live policy and, after
    replacing every anchor, anchored its (cut) head: the revoked right was in force
    again, with no damage reported. It must refuse, naming the live policy store, and
    the operator path it names (the live policy moved aside, then the restore run
    again) must end with the backup's policy, the revocation in force. ``older-store``:
    the same through a copy of the policy store taken before the revocation, put back."""
    settings = settings_for(backend)
    assert _decide(settings, clock).allowed
    copy_policy_store(backend, settings, tmp_path / "old-policy")
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_revoke(
            app_id=APP, role="role:assistant"
        )
    assert not _decide(settings, clock).allowed
    backup(settings, tmp_path / "bk")
    if attack == "cut":
        delete_policy_rows_from(backend, settings, policy_rows(backend, settings)[-1][0])
    else:
        put_policy_store_back(backend, settings, tmp_path / "old-policy")
    damaged = _decide(settings, clock)
    assert not damaged.allowed and DAMAGED in damaged.reason
    with pytest.raises(BackupError, match="policy store"):
        restore(settings, tmp_path / "bk")
    # On main the restore went through and the planner was served again. Refused, the
    # restore leaves its marker: no start serves anything until it is run again.
    with pytest.raises(RestoreInterruptedError):
        _decide(settings, clock)
    _empty_live_policy(backend, settings)
    restore(settings, tmp_path / "bk")
    final = _decide(settings, clock)
    assert not final.allowed and DAMAGED not in final.reason, final.reason


def test_a_start_on_a_views_store_behind_the_signed_checkpoint_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """HT (0139's gap): an older views store put back (``views.sqlite`` copied over the
    live one; on PostgreSQL its newer rows deleted) takes away the sign-outs written
    since, and the audit entries past a checkpoint the key folder keeps. On main the
    next start came up and served the signed-out web session again (only a later
    checkpoint was refused). A start must refuse, naming the rollback and the ways out;
    the note's deletion (accepting the loss) still works."""
    import sqlalchemy as sa

    from audit.tables import audit_entries
    from domain.errors import UprofError
    from tests.kernel.test_audit_log_rollback import _copy_sqlite, _cut_to
    from uprof.services.sign_outs import signed_out_sessions

    settings = settings_for(backend)
    views = Path(settings.data_dir) / "views.sqlite"
    with running(settings, clock) as k:
        k.audit.record("app.created", app_id="app:a0")
    older = tmp_path / "views-older.sqlite"
    if backend.kind == "sqlite":
        _copy_sqlite(views, older)
    else:
        engine = sa.create_engine(backend.url)
        with engine.connect() as conn:
            old_size = int(
                conn.execute(sa.select(sa.func.count()).select_from(audit_entries)).scalar_one()
            )
        engine.dispose()
    with running(settings, clock) as k:
        assert k.web_sign_outs is not None
        k.web_sign_outs.sign_out(
            "session-1", until=clock.now() + timedelta(hours=1), now=clock.now()
        )
        k.audit.record("app.created", app_id="app:a1")
        k.audit_log.checkpoint()  # a receipt, an export or a key poll signs one
    backup(settings, tmp_path / "bk")
    # The older views store put back.
    if backend.kind == "sqlite":
        for side in ("-wal", "-shm"):
            Path(f"{views}{side}").unlink(missing_ok=True)
        _copy_sqlite(older, views)
    else:
        _cut_to(backend, old_size)
        engine = sa.create_engine(backend.url)
        with engine.begin() as conn:
            conn.execute(signed_out_sessions.delete())
        engine.dispose()
    with pytest.raises(UprofError, match=r"audit-checkpoint\.note"):
        with running(settings, clock) as k:
            assert k.web_sign_outs is not None
            assert k.web_sign_outs.is_signed_out("session-1"), "a signed-out session opens again"
    # A restore beside the rolled-back log changes nothing: the log it would keep does not
    # extend the backup's, and it names the way (a restore into an empty data folder).
    with pytest.raises(BackupError, match="empty data folder"):
        restore(settings, tmp_path / "bk")
    # Accepting the loss on purpose (docs/audit-format.md): the note deleted, it starts.
    (settings.key_path / "audit-checkpoint.note").unlink()
    with running(settings, clock) as k:
        k.audit_log.checkpoint()


def test_one_tenants_damaged_policy_stream_denies_nothing_of_another_tenant(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held (blast radius): two tenants on the same stores, each with its policy stream.
    The revocation cut from the default tenant's stream makes every check of *that*
    tenant deny, naming the damage; the other tenant's start, seeded from its own file,
    still grants what its policy says, with no damage named."""
    settings = settings_for(backend)
    assert _decide(settings, clock).allowed
    seed = tmp_path / "acme.csv"
    seed.write_text(
        "p, role:assistant, acme, read, diet, personalization, allow\n"
        "g, app:planner, role:assistant, acme\n",
        encoding="utf-8",
    )
    acme = settings.model_copy(update={"tenant": "acme", "policy_path": seed})
    with running(acme, clock) as k:
        assert k.authorizer.decide(
            app_id=APP, tenant="acme", action="read", category="diet", purpose="personalization"
        ).allowed
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_revoke(
            app_id=APP, role="role:assistant"
        )
    delete_policy_rows_from(backend, settings, policy_rows(backend, settings)[-1][0])
    damaged = _decide(settings, clock)
    assert not damaged.allowed and DAMAGED in damaged.reason
    with running(acme, clock) as k:
        other = k.authorizer.decide(
            app_id=APP, tenant="acme", action="read", category="diet", purpose="personalization"
        )
        assert other.allowed, other.reason
        assert not k.policy.health()
