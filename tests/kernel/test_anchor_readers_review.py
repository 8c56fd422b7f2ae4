"""Review of decision 0150-anchor-readers: the whole-log anchor check of a rebuild and
of ``uprof backup``, attacked with real processes, both backends.

The check reads every anchor of the log, then every stream's head. Beside an honest,
busy deployment it must refuse nothing: captures appending (an anchor lagging its
head), subjects erased (a tombstone appended, then the anchor deleted with the keys),
items erased, consents withdrawn, new subjects written, all in other processes while
backups (the CLI, a process each) and rebuilds (another process) loop. And it must
refuse every damaged log: a stream deleted whole while its anchor stays.
"""

from __future__ import annotations

import sqlite3
import textwrap
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.errors import StoredDataDamagedError
from tests.children import CLI_SCRIPT, PythonChild, progress_count, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, cli_env, consent, running, say, settings_for
from tests.kernel.test_keys_apart import ALICE, BOB, fill
from tests.kernel.test_stream_anchor_review import _cut_head
from uprof.backends import backend_for_settings
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore
from uprof.settings import Settings

CATS, PURPOSE = ["preferences"], "personalization"

_ARGS = """
import sys, time
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
progress, stop = Path(sys.argv[4]), Path(sys.argv[5])
kernel = build_kernel(settings_for(backend), FakeClock())
"""

#: Captures, item erasures, consent flips and new subjects, until told to stop.
_WRITER = _ARGS + textwrap.dedent(
    """
    from domain.errors import ErasureIncompleteError, ItemNotFoundError, ReadTimeoutError
    try:
        i = 0
        while not stop.exists() or i < 4:
            kernel.capture("bob", say(f"I met Qzxw{i:03d} at the market", ref=f"w{i}"))
            consent(kernel, f"new{i}")
            kernel.capture(f"new{i}", say(f"note Qzxn{i:03d}"))
            kernel.process()
            items = [m for m in kernel.profile("bob").memories if "Qzxw" in m.text]
            if items:
                try:
                    kernel.erase_item("bob", items[0].item_id)
                except (ReadTimeoutError, ItemNotFoundError, ErasureIncompleteError):
                    pass
            granted = consent(kernel, "carol")
            kernel.withdraw_consent("carol", granted)
            i += 1
            progress.write_text(str(i))
    finally:
        kernel.close()
    """
)

#: Erases the subjects named after the arguments, one after another.
_ERASER = _ARGS + textwrap.dedent(
    """
    try:
        while not stop.exists():  # "stop" here: go (the first backup has started)
            time.sleep(0.01)
        from domain.errors import ErasureIncompleteError, ReadTimeoutError
        for n, subject in enumerate(sys.argv[6:], 1):
            # Beside a rebuild the views lag: "ask again", until it is done (the count
            # below says erased; 20 tries and on, as before, could say so untrue).
            while True:
                try:
                    kernel.erase_subject(subject)
                    break
                except (ErasureIncompleteError, ReadTimeoutError):
                    pass
            progress.write_text(str(n))
    finally:
        kernel.close()
    """
)

#: Rebuilds the views until told to stop; a refusal ends it with exit code 3.
_REBUILDER = _ARGS + textwrap.dedent(
    """
    from domain.errors import StoredDataDamagedError
    try:
        i = 0
        while not stop.exists() or i < 2:
            try:
                kernel.rebuild()
            except StoredDataDamagedError as error:
                print(f"refused: {error}", file=sys.stderr)
                sys.exit(3)
            i += 1
            progress.write_text(str(i))
    finally:
        kernel.close()
    """
)

ERASED = [f"e{i}" for i in range(8)]
#: A start's projection refused by another process's rebuild (exit code 6).
_LOST_RACE = "another worker processed this range first"


def test_backups_and_rebuilds_beside_writers_and_erasures_are_never_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held. Six subjects erased one after another, captures, item erasures, consent
    withdrawals and new subjects in other processes, while ``uprof backup`` (a process
    each time) and a rebuild loop (another process) run: every backup is written and
    every rebuild goes through (the anchors are read before the heads, and nothing
    honest removes a row: an erasure appends its tombstone and deletes the anchor)."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        for subject in ERASED:
            consent(k, subject)
            k.capture(subject, say(f"I met Qzx{subject}canary at the park"))
        k.process()
    base = (backend.kind, backend.url, str(backend.data_dir))
    stop, go = tmp_path / "stop", tmp_path / "go"
    marks = {name: tmp_path / name for name in ("writer", "eraser", "rebuilder")}
    writer = PythonChild(_WRITER, *base, str(marks["writer"]), str(stop))
    rebuilder = PythonChild(_REBUILDER, *base, str(marks["rebuilder"]), str(stop))
    eraser = PythonChild(_ERASER, *base, str(marks["eraser"]), str(go), *ERASED)
    backups = beside_erasures = lost = 0
    try:
        while eraser.poll() is None or backups < 3:
            for child in (writer, rebuilder):
                assert child.poll() is None, child.communicate()[1][-3000:]
            dest = tmp_path / f"bk{backups}-{lost}"
            making = PythonChild(CLI_SCRIPT, "backup", "--to", str(dest), env=cli_env(backend))
            go.touch()
            out, err = making.communicate(timeout=300)
            if making.returncode != 0 and _LOST_RACE in err:
                # Not the anchor check: the CLI's start projects the views before it
                # re-applies the ledger, and the rebuilder's reset under that batch
                # refuses it (found in this review, not fixed: see decision
                # 0157-review-of-0150). The check itself must never refuse.
                lost += 1
                continue
            assert making.returncode == 0, out + err[-3000:]
            backups += 1
            beside_erasures += eraser.poll() is None
        _, err = eraser.communicate(timeout=300)
        assert eraser.returncode == 0, err[-3000:]
    finally:
        stop.touch()
        go.touch()
        for child in (writer, rebuilder, eraser):
            _, err = child.communicate(timeout=300)
            assert child.returncode == 0, err[-3000:]
    print(
        f"backups {backups} ({beside_erasures} ended while erasures ran; {lost} lost the "
        "start's projection to the rebuild), "
        f"writer turns {progress_count(marks['writer'])}, "
        f"rebuilds {progress_count(marks['rebuilder'])}"
    )
    assert progress_count(marks["eraser"]) == len(ERASED)
    assert progress_count(marks["writer"]) >= 4 and progress_count(marks["rebuilder"]) >= 2
    # The loop ran while the others wrote: a last backup, and a rebuild, once all is quiet.
    backup(settings, tmp_path / "last")
    with running(settings, clock) as k:
        k.rebuild()


def _delete_stream(backend: Backend, clock: FakeClock, subject: str) -> None:
    """The attacker (a writer of the event store only): every row of the stream gone,
    its anchor left in the key store."""
    with running(settings_for(backend), clock) as k:
        app = k.app
        table = app.recorder.events_table_name  # type: ignore[attr-defined]
        key = app.backend.stream_key(k.stream_of(subject))
        with app.events_engine.begin() as conn:
            gone = conn.execute(
                sa.text(f"DELETE FROM {table} WHERE originator_id = :s"), {"s": key}
            ).rowcount
        assert gone > 0


def test_a_stream_deleted_whole_refuses_the_backup_and_the_rebuild(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held. Every row of alice's stream deleted, her anchor kept (its head is None):
    the backup writes nothing and the rebuild drops nothing. Since
    0227-leftovers-of-0218-to-0223 (UT) a subject exists once its stream holds events,
    and a stream its anchor says was written that holds none is damage: alice's own reads
    are told as damage (not as a name never made), the others' are served as before."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
    _delete_stream(backend, clock, "alice")
    with pytest.raises(StoredDataDamagedError):
        backup(settings, tmp_path / "bk")
    assert not (tmp_path / "bk").exists()
    with running(settings, clock) as k:
        with pytest.raises(StoredDataDamagedError):
            k.rebuild()
        assert BOB["memory"] in str(k.export_subject("bob")["memories"])
        with pytest.raises(StoredDataDamagedError):
            k.export_subject("alice")


def _cut_and_keep(k: Uprof, stream: UUID) -> Callable[[], None]:
    """The attacker (a writer of the event store only): cut the stream's newest row now,
    and return how to put it back, as it was (same version, topic and state)."""
    app = k.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    key = app.backend.stream_key(stream)
    engine = app.events_engine
    with engine.connect() as conn:
        head = conn.execute(
            sa.text(
                f"SELECT originator_version, topic, state FROM {table} WHERE originator_id = :s "
                "ORDER BY originator_version DESC LIMIT 1"
            ),
            {"s": key},
        ).one()
    _cut_head(k, stream)
    row = {"s": key, "v": int(head[0]), "t": str(head[1]), "st": bytes(head[2])}
    url = engine.url

    def put_back() -> None:
        other = sa.create_engine(url)  # another connection, as the attacker's own
        try:
            with other.begin() as conn:
                conn.execute(
                    sa.text(
                        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
                        "VALUES (:s, :v, :t, :st)"
                    ),
                    row,
                )
        finally:
            other.dispose()

    return put_back


def test_a_cut_put_back_between_the_copy_and_the_check_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alice withdraws her consent; the withdrawal is cut from her stream; the backup
    copies the log; the row is put back before the check. The check read the live store
    after the copy, which is whole again: the copy without the withdrawal was signed, and
    restored it put her consent in force again. The backup checks the copy itself now
    (SQLite: the copied file against the anchors read before it was copied; PostgreSQL:
    the dump's own snapshot)."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        k.withdraw_consent("alice", granted)
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        put_back = _cut_and_keep(k, k.stream_of("alice"))
    kind = type(backend_for_settings(settings))
    copy = kind.backup

    def copy_then_put_back(self: object, s: Settings, out: Path) -> dict[str, object]:
        try:
            return copy(self, s, out)  # type: ignore[arg-type]
        finally:
            put_back()  # once the copy is taken, whatever the backup then does

    monkeypatch.setattr(kind, "backup", copy_then_put_back)
    refused = 0
    try:
        backup(settings, tmp_path / "bk")
    except StoredDataDamagedError:
        refused = 1
    monkeypatch.undo()
    if not refused:  # what the signed copy holds, restored: the withdrawal is gone
        restore(settings, tmp_path / "bk")
        with running(settings, clock) as k:
            served = k.unconsented("alice", APP, CATS, PURPOSE)
        assert served == CATS, f"restored from the signed copy: consent in force ({served})"
    assert refused, "a copy of a cut log was signed"
    assert not (tmp_path / "bk").exists()
    with running(settings, clock) as k:  # the live log is whole again: nothing lost
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS


ERASED_MEMORY = "I met Qzxerasedcanary at the market"


def _copy(src: Path, dst: Path) -> None:
    """One SQLite file into another, through the driver (connections closed after)."""
    with closing(sqlite3.connect(src)) as a, closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def test_a_start_refused_on_views_ahead_of_a_cut_log_is_restored(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held. The start path (SQLite only: views ahead of the log come from the two files
    copied apart; on PostgreSQL they are one database). An older ``events.sqlite`` put
    back after an item erasure: the views are ahead, and alice's stream is below its
    anchor. The start refuses before it drops the views, naming the damage and the way
    out; ``uprof restore`` (a process of its own) of the last good backup is that way
    out: the next start serves alice without the erased memory."""
    if backend.kind != "sqlite":
        pytest.skip("views ahead of the log: the SQLite files copied apart")
    settings = settings_for(backend)
    events = settings.data_dir / "events.sqlite"
    with running(settings, clock) as k:
        consent(k, "alice")
        k.capture_many("alice", [say(ERASED_MEMORY, ref="a-1")])
        k.process()
        backup(settings, tmp_path / "good")
        older = tmp_path / "older.sqlite"
        _copy(events, older)
        [item] = [m for m in k.profile("alice").memories if m.text == ERASED_MEMORY]
        k.erase_item("alice", item.item_id)
        k.capture_many("alice", [say("note Qzxafter", ref="a-2")])
        k.process()
    for suffix in ("-wal", "-shm"):
        Path(f"{events}{suffix}").unlink(missing_ok=True)
    _copy(older, events)
    with pytest.raises(StoredDataDamagedError) as refused:
        with running(settings, clock):
            pass
    assert "restore" in str(refused.value)
    put_back = run_python(
        CLI_SCRIPT, "restore", "--from", str(tmp_path / "good"), env=cli_env(backend), timeout=300
    )
    assert put_back.returncode == 0, put_back.stdout + put_back.stderr[-3000:]
    with running(settings, clock) as k:
        assert ERASED_MEMORY not in str(k.export_subject("alice")["memories"])
        assert k.unconsented("alice", APP, CATS, PURPOSE) == []
