"""Attacks on the sealed policy store (decision 0140-sealed-policy-store), kept as tests
(SQLite and PostgreSQL): its one-off upgrade (a store of before the seal, the record lost
from the key folder as in GR, a start killed with SIGKILL midway), two processes changing
and checking the policy at once, and a data folder copied elsewhere."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from domain.policy import policy_id
from domain.principal import Principal
from tests import children
from tests.children import streaming_child
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import child_on, running, settings_for
from tests.kernel.policy_rows import (
    delete_policy_rows_from,
    forged_change,
    insert_policy_row,
    policy_rows,
    policy_to_legacy,
)
from uprof.crypto.keydir import UPGRADE_FILE_PREFIX
from uprof.crypto.tables import stream_heads
from uprof.facade import Facade
from uprof.services.policy_seal import BEGUN, UPGRADE
from uprof.settings import Settings

APP = "app:planner"
INTRUDER = "app:intruder"


def _record(settings: Settings, name: str = UPGRADE) -> Path:
    return settings.key_path / f"{UPGRADE_FILE_PREFIX}{name}"


def decide_read(k: Any, app: str, category: str = "diet") -> Any:
    """The tenant's policy decision now: may ``app`` read ``category`` of a subject for
    personalization?"""
    return k.authorizer.decide(
        app_id=app,
        tenant=k.subjects.tenant,
        action="read",
        category=category,
        purpose="personalization",
    )


def _revoke_planner(settings: Settings, clock: FakeClock) -> None:
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).policy_revoke(
            app_id=APP, role="role:assistant"
        )


def _anchor(k: Any) -> Any:
    app = k.policy.app
    return k.keystore.stream_head(app.log_id, str(policy_id(k.subjects.tenant)))


def _legacy_store(settings: Settings, clock: FakeClock) -> int:
    """A store of before the seal: the planner's role revoked, every policy row untagged,
    no anchor, no record. The rows."""
    _revoke_planner(settings, clock)
    with running(settings, clock) as k:
        return policy_to_legacy(k)


def _check_sealed(settings: Settings, clock: FakeClock, n: int) -> None:
    rows = policy_rows_of(settings)
    assert len(rows) >= n and all(state[:1] == b"\x03" for _, _, state in rows)
    assert _record(settings).exists() and not _record(settings, BEGUN).exists()
    with running(settings, clock) as k:
        assert not decide_read(k, APP).allowed  # the revocation still applies
        assert decide_read(k, APP).reason.find("stored_data_damaged") < 0
        assert _anchor(k).version == rows[-1][0]


_BACKEND: list[Backend] = []


def policy_rows_of(settings: Settings) -> list[tuple[int, str, bytes]]:
    return policy_rows(_BACKEND[0], settings)


@pytest.fixture(autouse=True)
def _remember(backend: Backend) -> Iterator[None]:
    _BACKEND[:] = [backend]
    yield
    _BACKEND.clear()


def test_a_store_of_before_the_seal_is_tagged_and_anchored_at_the_next_start(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    n = _legacy_store(settings, clock)
    assert n >= 2 and all(s[:1] == b"{" for _, _, s in policy_rows(backend, settings))
    with running(settings, clock) as k:  # the upgrade runs at this start
        assert not decide_read(k, APP).allowed
    _check_sealed(settings, clock, n)
    # Changes keep working, and the anchor protects what the upgrade tagged.
    rule = {
        "role": "role:assistant",
        "actions": ["read"],
        "categories": ["health"],
        "purpose": "personalization",
    }
    with running(settings, clock) as k:
        f = Facade(k, Principal.local_operator(k.subjects.tenant))
        assert f.policy_grant(**rule).changes
        assert f.policy_revoke(**rule).changes
    delete_policy_rows_from(backend, settings, policy_rows(backend, settings)[-1][0])
    with running(settings, clock) as k:
        decision = decide_read(k, APP)
        assert not decision.allowed and "stored_data_damaged" in decision.reason


@pytest.mark.parametrize("anchors_deleted", [False, True])
def test_a_row_forged_after_the_upgrade_is_not_tagged_when_the_record_is_lost(
    backend: Backend, clock: FakeClock, anchors_deleted: bool
) -> None:
    """GR's attack on this upgrade: the key folder's records gone (a copy of it from
    before, or the files deleted) and an untagged row forged; on PostgreSQL the policy
    anchors deleted too (same database). The next start must not tag the forged row."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        assert _record(settings).exists()  # a fresh deployment records it at once
        version, topic, state = forged_change(
            k.policy.app,
            k.subjects.tenant,
            lambda p: p.add_rule(
                [INTRUDER, k.subjects.tenant, "read", "diet", "personalization", "allow"],
                "operator:local#cli",
            ),
        )
        log_id = k.policy.app.log_id
        keys_engine = k.keys_engine
        if anchors_deleted:
            with keys_engine.begin() as conn:
                conn.execute(stream_heads.delete().where(stream_heads.c.log_id == log_id))
    insert_policy_row(backend, settings, version, topic, state)
    _record(settings).unlink()
    for _ in range(2):  # and the start after that
        with running(settings, clock) as k:
            decision = decide_read(k, INTRUDER)
            assert not decision.allowed
            assert "stored_data_damaged" in decision.reason and "policy store" in decision.reason
            assert k.policy.health()  # /readyz says so
    assert policy_rows(backend, settings)[-1][2][:1] == b"{"  # never tagged


VICTIM = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from uprof.services import policy_seal
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel
    from uprof.settings import Settings

    real = policy_seal.seal_legacy_policy_rows

    def paused(app, engine, material, *, again=False, after_rows=None):
        def stop(tagged):
            print(f"paused {tagged}", flush=True)
            time.sleep(600)  # killed here: rows committed, no anchor, no record
        return real(app, engine, material, again=again, after_rows=stop)

    policy_seal.seal_legacy_policy_rows = paused
    url = sys.argv[2] or None
    settings = Settings(data_dir=Path(sys.argv[1]), database_url=url, embedder="hashing")
    build_kernel(settings, FakeClock()).close()
    print("finished", flush=True)
    """
)


def test_a_start_killed_midway_through_the_upgrade_is_finished_by_the_next(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    n = _legacy_store(settings, clock)
    with child_on(VICTIM, backend) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("paused"), (line, child.communicate(5))
        child.kill()  # SIGKILL: no cleanup of any kind
        child.wait(30)
    assert all(s[:1] == b"\x03" for _, _, s in policy_rows(backend, settings))
    assert not _record(settings).exists() and _record(settings, BEGUN).exists()
    with running(settings, clock) as k:  # finishes it: anchors, records
        assert not decide_read(k, APP).allowed
    _check_sealed(settings, clock, n)


def _change_policy(data_dir: str, url: str | None, rounds: int, results: Any) -> None:
    try:
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel
        from uprof.settings import Settings

        settings = Settings(data_dir=Path(data_dir), database_url=url, embedder="hashing")
        k = build_kernel(settings, FakeClock())
        try:
            f = Facade(k, Principal.local_operator(k.subjects.tenant))
            for i in range(rounds):
                change = f.policy_grant if i % 2 == 0 else f.policy_revoke
                change(
                    app_id=APP, actions=["read"], categories=["health"], purpose="personalization"
                )
        finally:
            k.close()
        results.put("ok")
    except Exception as error:
        results.put(f"{type(error).__name__}: {str(error)[:300]}")


def test_checks_beside_another_process_changing_the_policy_never_read_damage(
    backend: Backend, clock: FakeClock
) -> None:
    """An anchor raised by the changer between a checker's anchor read and its event read
    (or the other way round) must never look like a cut: every check answers from a whole
    policy, and at the end both agree and the anchor names the final head."""
    settings = settings_for(backend)
    rounds = 30
    context = children.CONTEXT
    results = context.Queue()
    url = backend.url if backend.kind == "postgres" else None
    with running(settings, clock) as k:
        changer = context.Process(
            target=_change_policy, args=(str(settings.data_dir), url, rounds, results)
        )
        changer.start()
        reasons = set()
        while changer.is_alive():
            k.authorizer.refresh(force=True)
            reasons.add(decide_read(k, APP, "health").reason)
        changer.join(60)
        assert results.get(timeout=60) == "ok"
        assert not [r for r in reasons if "stored_data_damaged" in r or "unreadable" in r]
        k.authorizer.refresh(force=True)
        assert not decide_read(k, APP, "health").allowed  # an even count: the last was a revoke
        head = policy_rows(backend, settings)[-1][0]
        assert _anchor(k).version == head
        assert k.policy.show().version == head


def test_a_data_folder_copied_elsewhere_is_another_log_not_damage(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """SQLite: an operator's copy of the data folder opened elsewhere with the live key
    folder (a recovery, decision 0088) is another log: not refused; its policy is anchored
    at its first start, and a cut there is then seen. The live store keeps its anchor."""
    if backend.kind != "sqlite":
        pytest.skip("a PostgreSQL policy store has one log id: its copy is its database")
    settings = settings_for(backend)
    _revoke_planner(settings, clock)
    with running(settings, clock) as k:
        k.app.events_engine.dispose()
    copy = tmp_path / "copy" / "data"
    shutil.copytree(settings.data_dir, copy)
    there = settings.model_copy(update={"data_dir": copy, "key_dir": settings.key_path})
    with running(there, clock) as k:
        decision = decide_read(k, APP)
        assert not decision.allowed and "stored_data_damaged" not in decision.reason
    engine = sa.create_engine(f"sqlite:///{copy / 'policies.sqlite'}")
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("DELETE FROM stored_events WHERE originator_version = :v"),
                {"v": policy_rows(backend, settings)[-1][0]},
            )
    finally:
        engine.dispose()
    with running(there, clock) as k:
        assert "stored_data_damaged" in decide_read(k, APP).reason
    with running(settings, clock) as k:  # the live deployment: whole
        decision = decide_read(k, APP)
        assert not decision.allowed and "stored_data_damaged" not in decision.reason


def test_a_restore_does_not_tag_a_row_forged_into_the_live_policy(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A restore runs the upgrade again whatever the record says (a backup's policy may
    be of before the seal), and it keeps the live policy: a row forged untagged into the
    live policy must not be tagged by it (GR's attack, through ``uprof restore``)."""
    from uprof.services.backup import BackupError, backup, restore

    settings = settings_for(backend)
    with running(settings, clock):
        pass  # a deployment started once (its signing key), then backed up
    backup(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        version, topic, state = forged_change(
            k.policy.app,
            k.subjects.tenant,
            lambda p: p.add_rule(
                [INTRUDER, k.subjects.tenant, "read", "diet", "personalization", "allow"],
                "operator:local#cli",
            ),
        )
    insert_policy_row(backend, settings, version, topic, state)
    # The live policy is damaged: the restore refuses to keep it (bug HS), and names the
    # way to take the backup's instead.
    with pytest.raises(BackupError, match="live policy store is damaged"):
        restore(settings, tmp_path / "bk")
    assert policy_rows(backend, settings)[-1][2][:1] == b"{"  # never tagged


def _start(data_dir: str, url: str | None, barrier: Any, results: Any) -> None:
    try:
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel
        from uprof.settings import Settings

        settings = Settings(data_dir=Path(data_dir), database_url=url, embedder="hashing")
        barrier.wait(120)
        build_kernel(settings, FakeClock()).close()
        results.put("ok")
    except Exception as error:
        results.put(f"{type(error).__name__}: {str(error)[:300]}")


def test_two_processes_starting_at_once_on_a_store_of_before_the_seal(
    backend: Backend, clock: FakeClock
) -> None:
    """Both run the upgrade's start under the schema lock: one tags, the other finds it
    recorded; both come up, and no row is tagged twice or left untagged."""
    settings = settings_for(backend)
    n = _legacy_store(settings, clock)
    context = children.CONTEXT
    barrier, results = context.Barrier(2), context.Queue()
    url = backend.url if backend.kind == "postgres" else None
    processes = [
        context.Process(target=_start, args=(str(settings.data_dir), url, barrier, results))
        for _ in range(2)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert outcomes == ["ok", "ok"]
    _check_sealed(settings, clock, n)


CHANGER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from domain.principal import Principal
    from uprof.facade import Facade
    from uprof.services import policy_seal
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel
    from uprof.settings import Settings

    def killed_here(self, newest, first):
        print("committed", flush=True)
        time.sleep(600)  # killed here: the change committed, its anchor not raised

    url = sys.argv[2] or None
    settings = Settings(data_dir=Path(sys.argv[1]), database_url=url, embedder="hashing")
    k = build_kernel(settings, FakeClock())
    policy_seal.SealedPolicyLog.anchor_saved = killed_here
    Facade(k, Principal.local_operator(k.subjects.tenant)).policy_grant(
        role="role:assistant", actions=["read"], categories=["location"],
        purpose="personalization",
    )
    """
)


def test_a_change_killed_between_its_commit_and_its_anchor_is_adopted_not_damage(
    backend: Backend, clock: FakeClock
) -> None:
    """SIGKILL in 0132's crash window on the policy store: the change is committed, its
    anchor lags; the next start adopts the head (no false damage) and the change is in
    force."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        before = _anchor(k).version
        assert not decide_read(k, APP, "location").allowed  # what the change will grant
    url = backend.url if backend.kind == "postgres" else ""
    with streaming_child(CHANGER, str(settings.data_dir), url) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("committed"), (line, child.communicate(5))
        child.kill()
        child.wait(30)
    head = policy_rows(backend, settings)[-1][0]
    assert head == before + 1
    assert _stored_anchor(backend, settings) == before  # lagging, as the kill left it
    with running(settings, clock) as k:  # the start's load adopts the head
        decision = decide_read(k, APP, "location")
        assert decision.allowed and "stored_data_damaged" not in decision.reason
        assert _anchor(k).version == head


def _stored_anchor(backend: Backend, settings: Settings) -> int:
    """The policy stream's anchored version, read from the key store without a start."""
    url = (
        f"sqlite:///{settings.key_path / 'keys.sqlite'}"
        if backend.kind == "sqlite"
        else backend.url
    )
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(stream_heads.c.version).where(
                        stream_heads.c.stream_id == str(policy_id(settings.tenant))
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_an_untagged_snapshot_of_before_the_seal_is_dropped_and_rebuilt(
    backend: Backend, clock: FakeClock
) -> None:
    """A policy stream long enough to have a snapshot (every 100 events), all of it of
    before the seal: the upgrade drops the untagged snapshot (a cache), the policy loads
    from the tagged events, and the next snapshot is written tagged."""
    from tests.kernel.policy_rows import policy_engine

    settings = settings_for(backend)
    rule = {
        "role": "role:assistant",
        "actions": ["read"],
        "categories": ["location"],
        "purpose": "personalization",
    }
    with running(settings, clock) as k:
        f = Facade(k, Principal.local_operator(k.subjects.tenant))
        for i in range(100):  # seed + 100 changes: a snapshot at version 100
            (f.policy_grant if i % 2 == 0 else f.policy_revoke)(**rule)
        assert decide_read(k, APP, "location").allowed is False
        policy_to_legacy(k, keep_snapshots=True)

    def snapshots() -> list[bytes]:
        engine, _, table = policy_engine(backend, settings)
        try:
            with engine.connect() as conn:
                return [bytes(r[0]) for r in conn.execute(sa.text(f"SELECT state FROM {table}"))]
        finally:
            engine.dispose()

    assert [s[:1] for s in snapshots()] == [b"{"]
    with running(settings, clock) as k:
        assert snapshots() == []
        assert not decide_read(k, APP, "location").allowed
        assert "stored_data_damaged" not in decide_read(k, APP, "location").reason
        f = Facade(k, Principal.local_operator(k.subjects.tenant))
        for i in range(100):
            (f.policy_grant if i % 2 == 0 else f.policy_revoke)(**rule)
    assert [s[:1] for s in snapshots()] == [b"\x03"]
    with running(settings, clock) as k:
        assert not decide_read(k, APP, "location").allowed
        assert "stored_data_damaged" not in decide_read(k, APP, "location").reason
    # A tagged snapshot altered (its rule list rewritten) is damage like any row.
    engine, _, table = policy_engine(backend, settings)
    try:
        with engine.begin() as conn:
            (state,) = conn.execute(sa.text(f"SELECT state FROM {table}")).scalars()
            forged = bytes(state).replace(b"role:assistant", b"app:intruder")
            assert forged != bytes(state)
            conn.execute(sa.text(f"UPDATE {table} SET state = :st"), {"st": forged})
    finally:
        engine.dispose()
    with running(settings, clock) as k:
        decision = decide_read(k, INTRUDER)
        assert not decision.allowed and "stored_data_damaged" in decision.reason
