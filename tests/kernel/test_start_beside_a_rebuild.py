"""Bug KB: a start (``uprof backup``, any CLI command, a server) beside another process's
``uprof projections rebuild`` (SQLite and PostgreSQL, real processes).

Every start re-applies the erasure ledger; when the ledger names erased items and the
views are behind the log, it first projects the log to the head it found
(``recovery._project_to_head``). Beside a rebuild in another process, which had reset
the views, that catch-up's batches met the rebuild's replay: a batch refused
(``PositionMovedError``, nothing written) ended the start, so ``uprof backup`` beside
a rebuild failed with exit 6 ("another worker processed this range first"). The start's
catch-up and its reading of the views now run under the rebuild's own lock (the views'
schema lock): beside a rebuild, a start waits for it.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

from tests.children import CLI_SCRIPT, PythonChild, progress_count, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    build_kernel,
    cli_env,
    sail_intent_of_alice,
    say,
    settings_for,
)
from uprof.kernel import Uprof
from uprof.services.recovery import reapply_ledger

WAIT_S = 120

#: Backups taken beside the looping rebuild.
BACKUPS = 10


#: A real rebuild, in a process of its own, that starts when told. It says when it is
#: ready, when it asks for the rebuild's lock, when it found that lock held by another
#: process, and when it has reset the views; then it waits to be let go before its replay.
_REBUILD_WHEN_TOLD = textwrap.dedent(
    """
    import contextlib, sys, time
    from pathlib import Path
    import uprof.storage
    from uprof.backends import SchemaLockWaitError
    from tests.conftest import Backend
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel, settings_for

    backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    ready, start, wants, held_elsewhere, was_reset, go = (Path(a) for a in sys.argv[4:10])
    try_s = float(sys.argv[10])
    kernel = build_kernel(settings_for(backend), FakeClock())
    views = kernel.projections._views
    reset, lock = views.reset, uprof.storage.schema_lock

    def told(*args, **kwargs):
        reset(*args, **kwargs)
        was_reset.touch()
        while not go.exists():
            time.sleep(0.01)

    @contextlib.contextmanager
    def asked(engine, **how):
        wants.touch()
        try:
            # A short try first: held by the start, the lock is refused within it, and
            # the start need not wait out its bound for a reset that cannot land.
            with lock(engine, **dict(how, wait_s=try_s)):
                pass
        except SchemaLockWaitError:
            held_elsewhere.touch()
        with lock(engine, **how):
            yield

    views.reset = told
    uprof.storage.schema_lock = asked
    ready.touch()
    while not start.exists():
        time.sleep(0.01)
    try:
        kernel.rebuild()
    finally:
        kernel.close()
    """
)

#: How long a start's batch, read, waits for the other process's reset once that
#: process asked for the rebuild's lock: on main the reset lands within it; with the
#: start holding that lock it cannot land at all, and the wait ends as soon as the other
#: process says the lock was refused to it (it waited the whole bound before).
RESET_WAIT_S = 10.0

#: How long the other process tries the rebuild's lock before it says the lock is held
#: elsewhere (then it queues for it as a rebuild does).
LOCK_TRY_S = 0.5


def _erased_and_rebuilt_alike(kernel: Uprof, item_id: str) -> None:
    """The erased item stays out of the profile, and a rebuild from the log gives the
    very views the live projection holds."""
    assert item_id not in [i.item_id for i in kernel.profile("alice").intents]
    live = kernel.queries.table_digest()
    kernel.rebuild()
    assert kernel.queries.table_digest() == live


def _wait_for(path: Path, child: PythonChild, wait_s: float, *, or_for: Path | None = None) -> bool:
    """Wait for ``path`` (or ``or_for``) to exist, the child alive; False after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while not path.exists() and not (or_for is not None and or_for.exists()):
        assert child.poll() is None, child.communicate()[1][-3000:]
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_starts_catch_up_beside_another_processs_rebuild_completes(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The start's catch-up has read its first batch when another process's rebuild is
    told to go: on main the rebuild reset the views before the batch was applied, the
    apply was refused and the start failed with ``PositionMovedError`` (exit 6 in the
    CLI). Now the start holds the rebuild's lock: the rebuild waits, then runs whole."""
    kernel = build_kernel(settings_for(backend), clock)
    try:
        intent = sail_intent_of_alice(kernel, "sail")
        kernel.erase_item("alice", intent.item_id)  # the ledger names an item from now on
        kernel.process()

        ready, start, wants, held_elsewhere, was_reset, go = (
            tmp_path / name for name in ("ready", "start", "wants", "held", "reset", "go")
        )
        child = PythonChild(
            _REBUILD_WHEN_TOLD,
            backend.kind,
            backend.url,
            str(backend.data_dir),
            *(str(p) for p in (ready, start, wants, held_elsewhere, was_reset, go)),
            str(LOCK_TRY_S),
        )
        try:
            assert _wait_for(ready, child, WAIT_S), "the rebuild never got ready"
            # After the other process's own start, which caught the views up.
            kernel.capture("alice", say("I live in Paris", ref="paris"))  # views behind
            assert kernel.projections.position < kernel.app.max_notification_id()
            views = kernel.projections._views
            apply = views.apply_batch

            def rebuild_elsewhere_first(*args: Any, **kwargs: Any) -> Any:
                views.apply_batch = apply
                start.touch()
                assert _wait_for(wants, child, WAIT_S), "the rebuild never asked for its lock"
                _wait_for(was_reset, child, RESET_WAIT_S, or_for=held_elsewhere)
                return apply(*args, **kwargs)

            views.apply_batch = rebuild_elsewhere_first  # type: ignore[method-assign]
            try:
                reapply_ledger(kernel)  # what every start runs first (bootstrap)
            finally:
                views.apply_batch = apply  # type: ignore[method-assign]
        finally:
            start.touch()
            go.touch()
            _, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == 0, err[-3000:]
        kernel.process()
        assert kernel.projections.position >= kernel.app.max_notification_id()
        _erased_and_rebuilt_alike(kernel, intent.item_id)
    finally:
        kernel.close()


#: A rebuild looping in a process of its own until told to stop; counts its rounds.
_REBUILDS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.conftest import Backend
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel, settings_for

    backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    rounds, stop = Path(sys.argv[4]), Path(sys.argv[5])
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        n = 0
        while not stop.exists():
            kernel.rebuild()
            n += 1
            rounds.write_text(str(n))
    finally:
        kernel.close()
    """
)


def test_backups_beside_a_looping_rebuild_all_succeed_and_restore(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The reported failure, with real processes: ``uprof backup`` (each a process of its
    own) while another process rebuilds the views again and again, the ledger naming an
    erased item (so every backup's start catches the views up while a rebuild left them
    behind). Every backup exits 0; the last one restores, and the item stays erased."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(kernel, "sail")
        kernel.erase_item("alice", intent.item_id)
        for i in range(300):  # a replay long enough to be met (2 of 2 on main, SQLite)
            kernel.capture("alice", say(f"I visited city number {i}", ref=f"c{i}"))
        kernel.process()
    finally:
        kernel.close()
    rounds, stop = tmp_path / "rounds", tmp_path / "stop"
    rebuilder = PythonChild(
        _REBUILDS, backend.kind, backend.url, str(backend.data_dir), str(rounds), str(stop)
    )
    made: list[Path] = []
    try:
        for i in range(BACKUPS):
            assert rebuilder.poll() is None, rebuilder.communicate()[1][-3000:]
            to = tmp_path / f"bk{i}"
            done = run_python(
                CLI_SCRIPT, "backup", "--to", str(to), env=cli_env(backend), timeout=180
            )
            assert done.returncode == 0, done.stdout + done.stderr[-3000:]
            made.append(to)
    finally:
        stop.touch()
        _, err = rebuilder.communicate(timeout=180)
    assert rebuilder.returncode == 0, err[-3000:]
    assert progress_count(rounds) >= 1

    put_back = run_python(
        CLI_SCRIPT, "restore", "--from", str(made[-1]), env=cli_env(backend), timeout=180
    )
    assert put_back.returncode == 0, put_back.stdout + put_back.stderr[-3000:]
    kernel = build_kernel(settings, clock)
    try:
        kernel.process()
        _erased_and_rebuilt_alike(kernel, intent.item_id)
    finally:
        kernel.close()
