"""Stream-head anchors (bug EL, decision 0132-stream-head-anchor), both backends.

The key store keeps, for each subject stream, the newest version known committed and a
digest of that row. A writer of the event store without the key store who rolls the
whole store back to an older copy is refused for every subject the copy rolls back;
an honest process killed (SIGKILL) between its event commit and its anchor write leaves
a stream the next process loads; two processes appending to one stream leave the anchor
at the final head. The tail-row deletion itself is in ``test_forged_plain_row.py``.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import textwrap
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.errors import StoredDataDamagedError
from tests.children import PythonChild, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, settings_for
from tests.kernel.stored_rows import head_row
from uprof.crypto.keystore import StreamHead
from uprof.eventstore import head_digest
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore

CATS, PURPOSE = ["preferences"], "personalization"
CHILD_TIMEOUT_S = 120


def _anchor(k: Uprof, stream: UUID) -> StreamHead | None:
    return k.keystore.stream_head(k.app.log_id, str(stream))


def _anchored_at_head(k: Uprof, stream: UUID) -> bool:
    version, topic, state = head_row(k, stream)
    anchor = _anchor(k, stream)
    return anchor == StreamHead(
        str(stream), version, head_digest(str(stream), version, topic, state)
    )


def _refused(k: Uprof, subject: str) -> None:
    """Consent checks and slices of ``subject`` fail closed, named as damage."""
    with pytest.raises(StoredDataDamagedError):
        k.unconsented(subject, APP, CATS, PURPOSE)
    with pytest.raises(StoredDataDamagedError):
        k.slice(
            subject, "anything", budget_tokens=200, purpose=PURPOSE, app_id=APP, agent_id="coach"
        )


def _events_file(backend: Backend) -> Path:
    return backend.data_dir / "data" / "events.sqlite"


def _copy_aside(backend: Backend, to: Path) -> None:
    """A consistent copy of events.sqlite (no process has it open)."""
    src = sqlite3.connect(_events_file(backend))
    dst = sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def _copy_back(backend: Backend, copy: Path) -> None:
    """The attacker's restore: the old file in place, the newer write-ahead log gone."""
    live = _events_file(backend)
    for suffix in ("-wal", "-shm"):
        Path(f"{live}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(copy, live)


def test_an_older_copy_of_the_event_store_is_damage_for_the_subjects_it_rolls_back(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """alice and bob consent; a copy of the event store is taken (SQLite: the file;
    PostgreSQL: the log position); alice withdraws and carol appears; the copy is put
    back. alice (rolled back: consent back in force) and carol (gone) are damage in a
    fresh process; bob, whom the copy does not roll back, is served as before."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        consent(k, "bob")
        assert k.unconsented("alice", APP, CATS, PURPOSE) == []
        mark = k.app.max_notification_id()
    copy = tmp_path / "events-old.sqlite"
    if backend.kind == "sqlite":
        _copy_aside(backend, copy)
    with running(settings, clock) as k:
        k.withdraw_consent("alice", granted)
        consent(k, "carol")
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
    if backend.kind == "sqlite":
        _copy_back(backend, copy)
    else:
        with running(settings, clock) as k:
            table, nid = k.app.backend.events_table(k.app.recorder)
            with k.app.events_engine.begin() as conn:
                conn.execute(sa.text(f"DELETE FROM {table} WHERE {nid} > :m"), {"m": mark})
    with running(settings, clock) as k:
        _refused(k, "alice")
        _refused(k, "carol")
        assert k.unconsented("bob", APP, CATS, PURPOSE) == []
        with pytest.raises(StoredDataDamagedError):  # no consent written over the gap
            consent(k, "carol")


def test_an_honest_crash_between_the_event_and_its_anchor_loads(
    backend: Backend, clock: FakeClock
) -> None:
    """A real process withdraws alice's consent and is killed (SIGKILL) right after the
    event commits, before its anchor is written: the anchor lags the stream by that one
    event. The next process loads alice (the withdrawal in force) and adopts the head."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent_id = consent(k, "alice")
        stream = k.stream_of("alice")
        before = head_row(k, stream)[0]
        assert _anchored_at_head(k, stream)
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, settings_for
        from uprof.crypto.keystore import KeyStore

        def killed(*_args):
            os.kill(os.getpid(), signal.SIGKILL)

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = build_kernel(settings_for(backend), FakeClock())
        KeyStore.raise_stream_heads = killed
        kernel.withdraw_consent("alice", {consent_id!r})
        print("not killed", flush=True)
        """
    )
    done = run_python(script, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr[-2000:])
    with running(settings, clock) as k:
        head = head_row(k, stream)[0]
        assert head == before + 1  # the withdrawal committed
        anchor = _anchor(k, stream)
        assert anchor is not None and anchor.version == before  # its anchor never came
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        assert _anchored_at_head(k, stream)  # adopted by the load


APPENDER = """
import sys
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for

kind, url, folder, rounds, app = sys.argv[1:6]
kernel = build_kernel(settings_for(Backend(kind, url, Path(folder))), FakeClock())
try:
    print("ready", flush=True)
    sys.stdin_go = Path(folder, "go")
    import time
    while not sys.stdin_go.exists():
        time.sleep(0.01)
    for _ in range(int(rounds)):
        kernel.withdraw_consent("alice", consent(kernel, "alice", app=app))
finally:
    kernel.close()
print("done", flush=True)
"""


def test_two_processes_appending_to_one_stream_leave_the_anchor_at_the_final_head(
    backend: Backend, clock: FakeClock
) -> None:
    """Two real processes grant and withdraw alice's consents at once (each round two
    appends, retried on version conflicts): the anchor ends at the stream's final head,
    digest included, and a fresh process loads the stream."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k, "alice")
        stream = k.stream_of("alice")
    go = backend.data_dir / "go"
    children = [
        PythonChild(
            APPENDER,
            backend.kind,
            backend.url,
            str(backend.data_dir),
            "12",
            app,
            stream_stdout=True,
        )
        for app in (APP, "app:calendar")
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        go.touch()
        for child in children:
            out, err = child.communicate(CHILD_TIMEOUT_S)
            assert child.returncode == 0 and "done" in out, err[-2000:]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    with running(settings, clock) as k:
        assert head_row(k, stream)[0] == 1 + 1 + 2 * 2 * 12  # creation, grant, 48 appends
        assert _anchored_at_head(k, stream)
        assert k.unconsented("alice", APP, CATS, PURPOSE) == []  # the first grant stands


def test_an_erasure_deletes_the_anchor_and_a_restore_takes_the_restored_heads(
    backend: Backend, clock: FakeClock
) -> None:
    """Erasing a subject deletes its anchor with its keys (nothing of it stays behind);
    the anchors the operator's restore writes are the restored log's heads."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        alice, bob = k.stream_of("alice"), k.stream_of("bob")
        assert _anchor(k, alice) is not None
        k.erase_subject("alice")
        assert _anchor(k, alice) is None
        k.withdraw_consent("bob", consent(k, "bob"))
        assert k.app.reanchor() == 1  # bob's alone: alice is shredded
        assert _anchor(k, alice) is None
        assert _anchored_at_head(k, bob)


def test_an_anchor_write_that_fails_fails_no_committed_request(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key store refusing the anchor write after the event committed: the request
    still succeeds (it was written), the anchor lags, and the next load adopts the head."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        stream = k.stream_of("alice")

        def refused(*_a: object, **_k: object) -> None:
            raise sa.exc.OperationalError("INSERT INTO stream_heads", {}, Exception("locked"))

        monkeypatch.setattr(k.keystore, "raise_stream_heads", refused)
        k.withdraw_consent("alice", granted)
        monkeypatch.undo()
        anchor = _anchor(k, stream)
        assert anchor is not None and anchor.version == head_row(k, stream)[0] - 1
    with running(settings, clock) as k:
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        assert _anchored_at_head(k, stream)


def test_the_key_store_commits_with_fsync_again_after_an_anchor_write(
    backend: Backend, clock: FakeClock
) -> None:
    """The anchor's commit skips the key store's fsync (SQLite: NORMAL on its connection
    for that commit): every connection the key store's pool hands out afterwards is FULL
    again, so keys written later are flushed as before (decision 0017)."""
    if backend.kind != "sqlite":
        pytest.skip("PostgreSQL sets it for the anchor's transaction only (SET LOCAL)")
    with running(settings_for(backend), clock) as k:
        for n in range(3):
            consent(k, f"subject-{n}")
        with contextlib.ExitStack() as held:
            conns = [held.enter_context(k.keys_engine.connect()) for _ in range(8)]
            modes = {c.exec_driver_sql("PRAGMA synchronous").scalar() for c in conns}
        assert modes == {2}  # FULL


def test_an_operator_restore_of_an_older_backup_is_not_damage(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """``uprof restore`` of a backup taken before alice's withdrawal: the operator chose
    that log, so its heads become the anchors; alice loads (the withdrawal is gone with
    everything after the backup, as with any restore), where an older log put in place
    by hand is damage (above)."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        stream = k.stream_of("alice")
    backup(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        k.withdraw_consent("alice", granted)
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        assert _anchored_at_head(k, stream)
        assert k.unconsented("alice", APP, CATS, PURPOSE) == []
