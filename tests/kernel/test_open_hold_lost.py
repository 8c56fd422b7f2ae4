"""A process whose PostgreSQL session holding the stores open ended does not go on as if
it still held them (a real second process; PostgreSQL only: on SQLite the hold is a flock
of a file of its own, which only the process's exit releases).

Every running process holds the stores open with a session advisory lock, so that
``uprof restore`` refuses beside it (decision 0060). The lock lives as long as the
session: when the server ended that session (``pg_terminate_backend``, a server restart,
an idle-session timeout) the process went on serving and writing through its other
connections while holding nothing. A restore then ran beside it (as if nothing ran), and
the process went on with the state it had read from the stores before they were replaced.
Now the process notices at its next use of the stores: it takes the lock again when the
stores are still the ones it opened, and refuses everything (``StoresLostError``, restart
it) when a restore holds them or has replaced them meanwhile.
"""

from __future__ import annotations

import contextlib
import subprocess
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.children import PythonChild
from tests.conftest import Backend, _admin
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from tests.kernel.test_restore_bad_input import _deployment_with_a_backup
from uprof.backends import StoresInUseError
from uprof.backends.postgres import OPEN_LOCK_KEY
from uprof.kernel import Uprof
from uprof.services.backup import restore

pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def end_open_lock_sessions(database: str) -> int:
    """What the server does to a session it ends: here, every session holding the open
    lock of ``database`` (``pg_terminate_backend``, waiting up to 10 s for each to be gone:
    without a timeout it only signals, and the session's lock was still listed now and
    then when the test looked next)."""
    with _admin().connect() as conn:
        ended = conn.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(l.pid, 10000)) FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.classid = :hi AND l.objid = :lo "
                "AND l.objsubid = 1 AND a.datname = :db"
            ),
            {"hi": OPEN_LOCK_KEY >> 32, "lo": OPEN_LOCK_KEY & 0xFFFFFFFF, "db": database},
        ).scalar_one()
    return int(ended)


class Server:
    """Another process with a kernel on the stores. Each ``ask`` is a capture for "bob"
    (``-`` ends it; ``append nothing``: an empty append to the log through the event
    store's own connection pool, which is not the views engine's), answered ``ok`` or
    with the class of the error raised; questions and answers are files in ``talk``."""

    def __init__(self, backend: Backend, talk: Path) -> None:
        talk.mkdir()
        self.talk, self.asked = talk, 0
        script = textwrap.dedent(
            f"""
            import time
            from pathlib import Path
            from tests.conftest import Backend
            from tests.fakes.ports import FakeClock
            from tests.kernel.conftest import build_kernel, say, settings_for

            talk = Path({str(talk)!r})
            b = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
            kernel = build_kernel(settings_for(b), FakeClock())
            (talk / "a0.tmp").write_text("ready")  # renamed whole: never read half-written
            (talk / "a0.tmp").rename(talk / "a0")
            n = 1
            while True:
                question = talk / f"q{{n}}"
                while not question.exists():
                    time.sleep(0.005)
                text = question.read_text()
                if text == "-":
                    break
                try:
                    if text == "append nothing":  # through the event store's own pool
                        kernel.app.recorder.insert_events([])
                    else:
                        kernel.capture("bob", say(text))
                    answer = "ok"
                except Exception as error:
                    answer = type(error).__name__
                (talk / f"a{{n}}.tmp").write_text(answer)
                (talk / f"a{{n}}.tmp").rename(talk / f"a{{n}}")
                n += 1
            kernel.close()
            """
        )
        self.child = PythonChild(script)
        assert self._answer(0) == "ready"

    def _answer(self, n: int) -> str:
        answer = self.talk / f"a{n}"
        while not answer.exists():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(0.01)
            if self.child.poll() is not None:
                raise AssertionError(self.child.communicate()[1][-3000:])
        return answer.read_text()

    def _put(self, n: int, text: str) -> None:
        """Question ``n``, renamed into place whole: the child never reads it half-written."""
        (self.talk / f"q{n}.tmp").write_text(text)
        (self.talk / f"q{n}.tmp").rename(self.talk / f"q{n}")

    def ask(self, text: str) -> str:
        self.asked += 1
        self._put(self.asked, text)
        return self._answer(self.asked)

    def stop(self) -> None:
        if self.child.poll() is None:
            self._put(self.asked + 1, "-")
        _, err = self.child.communicate(120)
        assert self.child.returncode == 0, err[-3000:]


def test_a_process_whose_lock_session_ended_holds_the_stores_again(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    server = Server(backend, tmp_path / "talk")
    try:
        assert server.ask("before the cut Qzxbefore") == "ok"
        assert end_open_lock_sessions(backend.pg_dbname) == 1
        # The process goes on working: its next use of the stores takes the lock again.
        assert server.ask("after the cut Qzxafter") == "ok"
        with pytest.raises(StoresInUseError):
            restore(settings, tmp_path / "bk")
    finally:
        server.stop()


def test_a_process_the_stores_were_restored_under_refuses_to_go_on(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    server = Server(backend, tmp_path / "talk")
    try:
        assert server.ask("before the cut Qzxbefore") == "ok"
        assert end_open_lock_sessions(backend.pg_dbname) == 1
        # Before the process used the stores again, a restore found them free.
        restore(settings, tmp_path / "bk")
        assert server.ask("after the restore Qzxafter") == "StoresLostError"
        assert server.ask("and again Qzxagain") == "StoresLostError"
        assert server.ask("append nothing") == "StoresLostError"
    finally:
        server.stop()
    k = build_kernel(settings, clock)  # a restarted process starts on the restored stores
    try:
        export = str(k.export_subject("bob"))
        assert "Qzxafter" not in export and "Qzxagain" not in export
    finally:
        k.close()


def test_no_time_is_lost_when_the_session_is_still_there(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Guard: an uncut process keeps the stores, and a restore refuses beside it."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    server = Server(backend, tmp_path / "talk")
    try:
        assert server.ask("one Qzxone") == "ok"
        with pytest.raises(StoresInUseError):
            restore(settings, tmp_path / "bk")
        assert server.ask("two Qzxtwo") == "ok"
    finally:
        server.stop()


def test_the_event_stores_own_pool_notices_a_lost_hold_too(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A write to the log that touches nothing else (the event store has a connection
    pool of its own) is refused as well once a restore replaced the stores."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    server = Server(backend, tmp_path / "talk")
    try:
        assert server.ask("append nothing") == "ok"
        assert end_open_lock_sessions(backend.pg_dbname) == 1
        restore(settings, tmp_path / "bk")
        assert server.ask("append nothing") == "StoresLostError"
    finally:
        server.stop()


def open_lock_holders(database: str) -> int:
    with _admin().connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.classid = :hi AND l.objid = :lo "
                    "AND l.objsubid = 1 AND a.datname = :db AND l.granted"
                ),
                {"hi": OPEN_LOCK_KEY >> 32, "lo": OPEN_LOCK_KEY & 0xFFFFFFFF, "db": database},
            ).scalar_one()
        )


def test_a_failed_attempt_to_take_the_lock_again_is_tried_again(
    backend: Backend, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server is unreachable when the process first notices its session ended (a
    server restart): that request fails, and the next one takes the lock again; it never
    goes on through a reconnected connection that holds nothing."""
    from uprof.backends import postgres

    assert open_lock_holders(backend.pg_dbname) == 1
    assert end_open_lock_sessions(backend.pg_dbname) == 1
    assert open_lock_holders(backend.pg_dbname) == 0

    def unreachable(*_: object, **__: object) -> None:
        raise sa.exc.OperationalError("connect", {}, Exception("server restarting"))

    with monkeypatch.context() as down:
        down.setattr(postgres, "_advisory", unreachable)
        with pytest.raises(sa.exc.OperationalError):
            kernel.audit_log.size()
    kernel.audit_log.size()  # the server is back: the lock is taken again

    assert open_lock_holders(backend.pg_dbname) == 1
