"""The start that tags the plaintext rows written before tags existed (bug EK's upgrade;
decision 0136-authenticated-plaintext-rows), both backends.

A store of before the change is built by writing raw rows: every plaintext row of a store
the current code wrote (capture erasures, a subject's erasure) re-written in the old
format ``0x00 | JSON state`` and the upgrade's record removed from the key store. The next
start tags them; killed midway (SIGKILL, a real process) the start after finishes; two
processes starting at once both come up with every row tagged once.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.errors import StoredDataDamagedError
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, child_on, consent, running, say, settings_for
from tests.kernel.policy_rows import policy_to_legacy
from tests.kernel.stored_rows import head_row
from uprof.crypto.keydir import UPGRADE_FILE_PREFIX
from uprof.crypto.keystore import StreamHead
from uprof.crypto.mapper import PLAIN_TAG, PLAIN_TOPICS
from uprof.crypto.plain_rows import BEGUN, UPGRADE
from uprof.crypto.tables import plain_row_keys
from uprof.eventstore import head_digest
from uprof.kernel import Uprof
from uprof.settings import Settings

CATS, PURPOSE = ["preferences"], "personalization"


def _plain_rows(k: Uprof) -> list[tuple[Any, int, bytes]]:
    """(originator id as stored, version, state) of every plaintext-topic row."""
    app = k.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    query = sa.text(
        f"SELECT originator_id, originator_version, state FROM {table} WHERE topic IN :t"
    ).bindparams(sa.bindparam("t", expanding=True))
    with app.events_engine.connect() as conn:
        rows = conn.execute(query, {"t": sorted(PLAIN_TOPICS)}).all()
    return [(r[0], int(r[1]), bytes(r[2])) for r in rows]


def _record(settings: Settings) -> Path:
    """The key folder's record that the upgrade finished."""
    return settings.key_path / f"{UPGRADE_FILE_PREFIX}{UPGRADE}"


def _recorded(k: Uprof) -> bool:
    return _record(k.settings).exists()


def _to_legacy(k: Uprof, *, forget_upgrade: bool = True) -> int:
    """Re-write every tagged plaintext row as before tags existed; the rows re-written."""
    app = k.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    n = 0
    with app.events_engine.begin() as conn:
        for stream, version, state in _plain_rows(k):
            assert state[:1] == b"\x03"
            conn.execute(
                sa.text(
                    f"UPDATE {table} SET state = :st "
                    "WHERE originator_id = :s AND originator_version = :v"
                ),
                {"st": b"\x00" + state[5 + PLAIN_TAG :], "s": stream, "v": version},
            )
            n += 1
    if forget_upgrade:
        # A store of before the upgrade: no record, and no plain-row key either (the
        # upgrade's first pass creates it; a key without a pass begun or done on record
        # means the record was lost after the upgrade, bug GR).
        _record(k.settings).unlink()
        # The policy store was sealed with the same key after the plain-row upgrade
        # (decision 0140-sealed-policy-store): a store of before both holds it untagged.
        policy_to_legacy(k)
        with k.keys_engine.begin() as conn:
            conn.execute(plain_row_keys.delete())
    return n


def _old_store(backend: Backend, clock: FakeClock, *, forget_upgrade: bool = True) -> int:
    """alice: four captures, three of them erased (plaintext ``CaptureErased`` rows and
    what erasure writes with them), her consent withdrawn; bob erased (``SubjectErased``).
    Every plaintext row in the old format, and the upgrade's record in the key folder
    removed (``forget_upgrade``); the number of rows."""
    with running(settings_for(backend), clock) as k:
        granted = consent(k, "alice")
        acks = k.capture_many("alice", [say(f"I like tea number {i}") for i in range(4)])
        k.process_to_log_end()
        for ack in acks[:3]:
            k.erase_capture("alice", ack.capture_id)
        k.withdraw_consent("alice", granted)
        consent(k, "bob")
        k.capture("bob", say("I live in Lyon"))
        k.erase_subject("bob")
        return _to_legacy(k, forget_upgrade=forget_upgrade)


def _check_upgraded(k: Uprof, n: int) -> None:
    rows = _plain_rows(k)
    assert len(rows) == n and all(s[:1] == b"\x03" for _, _, s in rows)
    assert _recorded(k)
    assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS  # the withdrawal still applies
    k.profile("alice")  # the stream, with its capture erasures, loads


def test_a_store_with_untagged_plain_rows_loads_after_the_next_start(
    backend: Backend, clock: FakeClock
) -> None:
    n = _old_store(backend, clock)
    assert n >= 4  # three capture erasures and bob's tombstone at least
    with running(settings_for(backend), clock) as k:
        _check_upgraded(k, n)
        k.process_to_log_end()  # the pipeline reads every tombstone again
    with running(settings_for(backend), clock) as k:  # recorded: nothing to do again
        _check_upgraded(k, n)


def test_untagged_rows_after_the_upgrade_are_damage(backend: Backend, clock: FakeClock) -> None:
    """The same old-format rows with the upgrade recorded (an event-store writer restoring
    or forging them afterwards): never tagged, never read: the stream does not load."""
    _old_store(backend, clock, forget_upgrade=False)
    with running(settings_for(backend), clock) as k:
        assert all(s[:1] == b"\x00" for _, _, s in _plain_rows(k))
        with pytest.raises(StoredDataDamagedError, match="not authenticated"):
            k.unconsented("alice", APP, CATS, PURPOSE)


VICTIM = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import uprof.bootstrap as bootstrap
    from uprof.crypto import plain_rows
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel
    from uprof.settings import Settings

    def paused(app, keystore, material, *, again):
        def after_page(rewritten):
            if rewritten >= 2:
                print(f"paused {rewritten}", flush=True)
                time.sleep(600)  # killed here
        return plain_rows.tag_legacy_plain_rows(
            app, keystore, material, again=again, page=1, after_page=after_page
        )

    bootstrap.tag_legacy_plain_rows = paused
    url = sys.argv[2] or None
    settings = Settings(data_dir=Path(sys.argv[1]), database_url=url, embedder="hashing")
    build_kernel(settings, FakeClock()).close()
    print("finished", flush=True)
    """
)


def test_a_start_killed_midway_through_the_upgrade_is_finished_by_the_next(
    backend: Backend, clock: FakeClock
) -> None:
    n = _old_store(backend, clock)
    with child_on(VICTIM, backend) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("paused"), (line, child.communicate(5))
        child.kill()  # SIGKILL mid-upgrade: no cleanup of any kind
        child.wait(30)
    with _raw_look(backend) as (rows, recorded):
        tagged = sum(1 for _, _, s in rows if s[:1] == b"\x03")
        assert 2 <= tagged < n and not recorded  # midway: some tagged, nothing recorded
    begun = settings_for(backend).key_path / f"{UPGRADE_FILE_PREFIX}{BEGUN}"
    assert begun.exists()  # the pass is on record as begun: the next start resumes it
    with running(settings_for(backend), clock) as k:  # the next start finishes it
        _check_upgraded(k, n)
    assert not begun.exists()  # finished: a lost record no longer resumes anything (GR)


@contextmanager
def _raw_look(backend: Backend) -> Iterator[tuple[list[tuple[Any, int, bytes]], bool]]:
    """The plaintext rows and the upgrade's record, read without a start (which would
    finish the upgrade): straight from the stores."""
    from uprof.storage import layout_for, open_engines

    layout = layout_for(settings_for(backend))
    stores = open_engines(layout)
    try:
        table = "stored_events" if backend.kind == "sqlite" else "profiles_events"
        query = sa.text(
            f"SELECT originator_id, originator_version, state FROM {table} WHERE topic IN :t"
        ).bindparams(sa.bindparam("t", expanding=True))
        with stores.events.connect() as conn:
            rows = [
                (r[0], int(r[1]), bytes(r[2]))
                for r in conn.execute(query, {"t": sorted(PLAIN_TOPICS)})
            ]
        yield rows, _record(settings_for(backend)).exists()
    finally:
        stores.dispose()


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


def test_two_processes_starting_at_once_both_come_up_with_every_row_tagged(
    backend: Backend, clock: FakeClock
) -> None:
    n = _old_store(backend, clock)
    context = children.CONTEXT
    barrier, results = context.Barrier(2), context.Queue()
    url = backend.url if backend.kind == "postgres" else None
    processes = [
        context.Process(target=_start, args=(str(backend.data_dir / "data"), url, barrier, results))
        for _ in range(2)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert outcomes == ["ok", "ok"]
    with running(settings_for(backend), clock) as k:
        _check_upgraded(k, n)


def test_plain_rows_verify_after_a_kek_rotation_and_a_new_plain_row_key(
    backend: Backend, clock: FakeClock
) -> None:
    """The plain-row key is wrapped by the KEK: a rotation re-wraps it with the DEKs and
    forgets the old epoch, and the tagged rows still verify in a fresh process. A second
    plain-row key (rotation of the key itself) tags new rows; the old ones verify under
    the id their tag names."""
    n = _old_store(backend, clock)
    with running(settings_for(backend), clock) as k:
        _check_upgraded(k, n)
        assert k.rotate_keys()["epochs_forgotten"] >= 1
    with running(settings_for(backend), clock) as k:
        _check_upgraded(k, n)
        assert k.keystore.add_plain_row_key() == 2  # type: ignore[attr-defined]
    with running(settings_for(backend), clock) as k:
        consent(k, "carol")
        acks = k.capture_many("carol", [say("I like jazz"), say("I like rock")])
        k.erase_capture("carol", acks[0].capture_id)  # tombstones tagged under key 2
        ids = {int.from_bytes(s[1:5], "big") for _, _, s in _plain_rows(k)}
        assert ids == {1, 2}
    with running(settings_for(backend), clock) as k:
        _check_upgraded(k, len(_plain_rows(k)))  # alice's rows, under key 1
        assert k.unconsented("carol", APP, CATS, PURPOSE) == []  # carol's, under key 2
        k.process_to_log_end()  # every tombstone read again by the pipeline


# ----------------------------------------------------------- with stream anchors (0132)

ANCHORED = ("alice", "dave")


def _anchored_old_store(backend: Backend, clock: FakeClock) -> tuple[int, list[UUID]]:
    """alice and dave: a capture each erased, so each stream's head is a plaintext
    ``CaptureErased``; every plaintext row then in the old format, and each stream anchored
    at that untagged head, as a deployment that ran decision 0132 before this upgrade holds
    it (the digest of the untagged bytes). The rows and the streams."""
    with running(settings_for(backend), clock) as k:
        streams = []
        for name in ANCHORED:
            consent(k, name)
            acks = k.capture_many(name, [say(f"{name} likes tea"), say(f"{name} likes jazz")])
            k.process_to_log_end()
            k.erase_capture(name, acks[0].capture_id)
            streams.append(k.stream_of(name))
        n = _to_legacy(k)
        assert k.app.reanchor() >= len(ANCHORED)  # what 0132's code wrote for these rows
        for stream in streams:
            version, topic, state = head_row(k, stream)
            assert topic in PLAIN_TOPICS and state[:1] == b"\x00"
            assert k.keystore.stream_head(k.app.log_id, str(stream)) == StreamHead(
                str(stream), version, head_digest(str(stream), version, topic, state)
            )
        return n, streams


def _check_anchored(k: Uprof, n: int, streams: list[UUID]) -> None:
    """Every plaintext row tagged, each stream anchored at its (tagged) head, and each
    loads: consent checks and profiles served, no "head replaced"."""
    rows = _plain_rows(k)
    assert len(rows) == n and all(s[:1] == b"\x03" for _, _, s in rows)
    assert _recorded(k)
    for name, stream in zip(ANCHORED, streams, strict=True):
        assert k.unconsented(name, APP, CATS, PURPOSE) == []
        assert [m.text for m in k.profile(name).memories] == [f"{name} likes jazz"]
        version, topic, state = head_row(k, stream)
        assert state[:1] == b"\x03"
        assert k.keystore.stream_head(k.app.log_id, str(stream)) == StreamHead(
            str(stream), version, head_digest(str(stream), version, topic, state)
        )


def test_untagged_head_rows_with_anchors_load_after_the_upgrade(
    backend: Backend, clock: FakeClock
) -> None:
    """The upgrade re-writes anchored head rows: it moves their anchors with them, so no
    stream reads as "head replaced" (decision 0132's anchors of a deployment that ran it
    before this upgrade)."""
    n, streams = _anchored_old_store(backend, clock)
    with running(settings_for(backend), clock) as k:
        _check_anchored(k, n, streams)
    with running(settings_for(backend), clock) as k:  # recorded: nothing to do again
        _check_anchored(k, n, streams)


BETWEEN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from uprof.eventstore import ProfilesApplication
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel
    from uprof.settings import Settings

    move = ProfilesApplication.move_anchors

    def moved_then_paused(self, rewrites):
        n = move(self, rewrites)
        if n:  # an anchor moved; its row is not re-written yet
            print(f"moved {n}", flush=True)
            time.sleep(600)  # killed here
        return n

    ProfilesApplication.move_anchors = moved_then_paused
    url = sys.argv[2] or None
    settings = Settings(data_dir=Path(sys.argv[1]), database_url=url, embedder="hashing")
    build_kernel(settings, FakeClock()).close()
    print("finished", flush=True)
    """
)


def test_a_start_killed_between_an_anchor_move_and_its_row_loads_after_the_next(
    backend: Backend, clock: FakeClock
) -> None:
    """A real process runs the upgrade and is killed (SIGKILL) right after a page's
    anchor moved to the tagged row's digest, before that row is re-written: the anchor
    names bytes not stored yet. The next start finds the anchor already moved (left alone)
    and re-writes the row to exactly those bytes: every stream loads."""
    n, streams = _anchored_old_store(backend, clock)
    with child_on(BETWEEN, backend) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("moved"), (line, child.communicate(5))
        child.kill()
        child.wait(30)
    with _raw_look(backend) as (_, recorded):
        assert not recorded
    with _raw_heads_and_anchors(backend) as (heads, anchors):
        # The window was hit: the streams' anchors (one page: moved in one transaction)
        # name head rows that are still untagged (their digests not those rows').
        torn = [
            s
            for s in streams
            if heads[s][2][:1] == b"\x00"
            and anchors[s] != (heads[s][0], head_digest(str(s), *heads[s]))
        ]
        assert sorted(torn) == sorted(streams), (heads, anchors)
        assert all(anchors[s][0] == heads[s][0] for s in streams)
    with running(settings_for(backend), clock) as k:  # the next start finishes it
        _check_anchored(k, n, streams)


@contextmanager
def _raw_heads_and_anchors(
    backend: Backend,
) -> Iterator[tuple[dict[UUID, tuple[int, str, bytes]], dict[UUID, tuple[int, str]]]]:
    """Each stream's head row and each anchor of the live log, read straight from the
    stores (no start, which would finish the upgrade)."""
    from uprof.backends import backend_for
    from uprof.crypto.tables import stream_heads
    from uprof.eventstore import log_identity
    from uprof.storage import layout_for, open_engines

    stores = open_engines(layout_for(settings_for(backend)))
    try:
        table = "stored_events" if backend.kind == "sqlite" else "profiles_events"
        with stores.events.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT originator_id, originator_version, topic, state FROM {table} "
                    "ORDER BY originator_version"
                )
            ).all()
        heads = {UUID(str(r[0])): (int(r[1]), str(r[2]), bytes(r[3])) for r in rows}
        log = log_identity(backend_for(stores.events), stores.events)
        c = stream_heads.c
        with stores.keys.connect() as conn:
            found = conn.execute(
                sa.select(c.stream_id, c.version, c.digest).where(c.log_id == log)
            ).all()
        yield heads, {UUID(str(r[0])): (int(r[1]), str(r[2])) for r in found}
    finally:
        stores.dispose()


def test_the_re_written_rows_commit_flushed_before_the_upgrade_is_recorded(
    backend: Backend, clock: FakeClock
) -> None:
    """SQLite: the event store's own engine commits with ``synchronous=NORMAL`` (no fsync
    per commit in WAL). The upgrade's record in the key folder is flushed; rows re-written
    by a NORMAL commit can be lost in a power cut after it, and every row lost so is then
    an untagged row after the record: damage for good (and an anchor already moved names
    bytes no longer stored). Each re-writing transaction must commit ``FULL``."""
    from uprof.bootstrap import build_key_material
    from uprof.crypto.plain_rows import tag_legacy_plain_rows

    if backend.kind != "sqlite":
        pytest.skip("PostgreSQL: every commit of the event store is flushed (synchronous_commit)")
    _old_store(backend, clock)
    seen: list[int] = []
    with running(settings_for(backend), clock) as k:
        _to_legacy(k)

        def on_execute(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if statement.lstrip().upper().startswith("UPDATE") and "SET state" in statement:
                seen.append(cursor.connection.execute("PRAGMA synchronous").fetchone()[0])

        sa.event.listen(k.app.events_engine, "before_cursor_execute", on_execute)
        try:
            n = tag_legacy_plain_rows(k.app, k.keystore, build_key_material(k.settings), again=True)
        finally:
            sa.event.remove(k.app.events_engine, "before_cursor_execute", on_execute)
        assert n and len(seen) == n
        assert set(seen) == {2}, seen  # 2: FULL
        with k.app.events_engine.connect() as conn:  # and the pool's connection is back
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == 1  # NORMAL


def test_a_restore_of_a_backup_taken_before_the_upgrade_tags_its_rows(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Review of 0136, end to end (left untested by 0136): a backup taken before the
    upgrade holds untagged rows (and the backup no keys); the live deployment upgrades
    (its record in the key folder, which the restore keeps); restoring that backup tags the
    restored rows at its start whatever the record says, then re-anchors: every plaintext
    row is tagged, alice's withdrawal applies, her profile loads, the pipeline reads every
    tombstone, and the start after comes up the same."""
    from uprof.services.backup import backup, restore

    settings = settings_for(backend)
    n = _old_store(backend, clock)
    backup(settings, tmp_path / "bk")  # no start of this release in between
    with running(settings, clock) as k:
        _check_upgraded(k, n)
        k.process_to_log_end()
    restore(settings, tmp_path / "bk")
    for _ in range(2):  # the start after the restore, and the one after it
        with running(settings, clock) as k:
            _check_upgraded(k, n)
            k.process_to_log_end()
