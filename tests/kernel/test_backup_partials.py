"""What a killed ``uprof backup`` leaves behind (bug KI, decision
0164-restore-across-upgrade), with real ``uprof backup`` processes, both backends.

A backup writes into a hidden ``.<name>.partial-<hex>`` folder beside the destination and
renames it when complete. Killed with SIGKILL, it left that folder: a copy of the views
and the event log under the subjects' keys (readable with the key folder until an
erasure shreds a key), outside the backup set. Nothing removed it and the residue audit
(which reads the data folder; a backup may not be inside it) did not see it. Now the
next backup to the same parent folder removes it, never the folder of a backup another
process is still writing, and ``uprof audit residue --backups <folder>`` reports it.
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests.children import CLI_SCRIPT, PythonChild, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import cli_env
from tests.kernel.test_keys_apart import assert_bob_intact, filled_deployment
from uprof.services.backup import restore

#: ``uprof backup`` that copies the stores for real, then waits before its manifest
#: until ``argv[1]`` exists (or until it is killed): a backup caught in the middle.
_PAUSED_BACKUP = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from uprof.backends import backend_for_settings
    from uprof.settings import Settings

    go = Path(sys.argv.pop(1))
    kind = type(backend_for_settings(Settings()))
    real = kind.backup

    def _copy_then_wait(self, settings, out):
        manifest = real(self, settings, out)
        print("copied", out, flush=True)
        while not go.exists():
            time.sleep(0.05)
        return manifest

    kind.backup = _copy_then_wait
    from uprof.cli.main import app
    app()
    """
)


def _paused_backup(backend: Backend, go: Path, to: Path) -> tuple[PythonChild, Path]:
    """A real ``uprof backup --to <to>`` paused after its copy; its partial folder."""
    child = PythonChild(
        _PAUSED_BACKUP, str(go), "backup", "--to", str(to), env=cli_env(backend), stream_stdout=True
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("copied"), (line, child.communicate(timeout=60))
    partial = Path(line.split(" ", 1)[1].strip())
    assert partial.parent == to.parent and partial.name.startswith(f".{to.name}.partial-")
    assert any(p.stat().st_size > 0 for p in partial.iterdir())  # a real copy of the stores
    return child, partial


def _residue(backend: Backend, backups: Path) -> tuple[int, str]:
    done = run_python(
        CLI_SCRIPT, "audit", "residue", "--term", "Qzxnothere", "--backups", str(backups),
        env=cli_env(backend), timeout=180,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr[-2000:]


def test_a_backup_killed_by_sigkill_leaves_a_partial_the_next_backup_removes(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = filled_deployment(backend, clock, "bob")
    out = tmp_path / "out"
    child, partial = _paused_backup(backend, tmp_path / "never", out / "bk1")
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert partial.is_dir() and not (out / "bk1").exists()
    # The residue audit finds it, naming it.
    code, text = _residue(backend, out)
    assert code == 1 and partial.name in text, text
    made = run_python(
        CLI_SCRIPT, "backup", "--to", str(out / "bk2"), env=cli_env(backend), timeout=180
    )
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    assert not partial.exists()
    assert sorted(p.name for p in out.iterdir()) == ["bk2"]  # no partial, no lock file left
    code, text = _residue(backend, out)
    assert code == 0, text
    restore(settings, out / "bk2")
    assert_bob_intact(settings, clock, audit_verifies=True)


def test_a_backup_beside_another_still_writing_leaves_its_partial_alone(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Two backups at once into one parent folder: the second must not remove the first
    one's partial (it is being written), and the first completes into a backup that
    restores."""
    settings = filled_deployment(backend, clock, "bob")
    out, go = tmp_path / "out", tmp_path / "go"
    first, partial = _paused_backup(backend, go, out / "bk1")
    try:
        made = run_python(
            CLI_SCRIPT, "backup", "--to", str(out / "bk2"), env=cli_env(backend), timeout=180
        )
        assert made.returncode == 0, made.stdout + made.stderr[-3000:]
        assert partial.is_dir()
        # Reported as being written, not as left over.
        code, text = _residue(backend, out)
        assert code == 0 and partial.name in text, text
    finally:
        go.touch()
        done = first.communicate(timeout=180)
    assert first.returncode == 0, done
    assert not partial.exists()
    assert sorted(p.name for p in out.iterdir()) == ["bk1", "bk2"]
    restore(settings, out / "bk1")
    assert_bob_intact(settings, clock, audit_verifies=True)


def test_a_partial_left_by_an_earlier_release_is_removed_too(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A partial without a writer's lock (written before this fix, or its lock file
    lost): no process holds it, so it is stale."""
    filled_deployment(backend, clock, "bob")
    out = tmp_path / "out"
    old = out / ".bk0.partial-0123abcd"
    old.mkdir(parents=True)
    (old / "views.sqlite").write_bytes(b"a copy of the views")
    code, text = _residue(backend, out)
    assert code == 1 and old.name in text, text
    assert sorted(p.name for p in out.iterdir()) == [old.name]  # the audit wrote nothing
    made = run_python(
        CLI_SCRIPT, "backup", "--to", str(out / "bk"), env=cli_env(backend), timeout=180
    )
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    assert not old.exists()


def test_backups_at_once_into_one_folder_each_complete_and_leave_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Three real ``uprof backup`` processes at once into one parent folder holding a
    stale partial: each removes stale ones while the others write, none removes
    another's folder; every backup is complete (its manifest and checksums check) and
    nothing else is left."""
    from uprof.services.backup import read_manifest

    settings = filled_deployment(backend, clock, "bob")
    out = tmp_path / "out"
    old = out / ".bk9.partial-89abcdef"
    old.mkdir(parents=True)
    (old / "events.sqlite").write_bytes(b"a copy of the log")
    names = [f"bk{i}" for i in range(3)]
    children = [
        PythonChild(CLI_SCRIPT, "backup", "--to", str(out / name), env=cli_env(backend))
        for name in names
    ]
    results = [(child.communicate(timeout=240), child.returncode) for child in children]
    assert [code for _, code in results] == [0, 0, 0], results
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        read_manifest(settings, out / name)


#: ``uprof backup`` on SQLite stopped in the middle of a file's copy: every backup API
#: copy runs one page per step, and after the first page of the event log it waits
#: until ``argv[1]`` exists (or it is killed).
_MID_COPY_BACKUP = textwrap.dedent(
    """
    import sqlite3, sys, time
    from pathlib import Path

    go = Path(sys.argv.pop(1))
    connect = sqlite3.connect

    class _PageByPage(sqlite3.Connection):
        def backup(self, target, **kw):
            file = Path(target.execute("PRAGMA database_list").fetchall()[0][2])

            def step(status, remaining, total):
                if remaining > 0 and file.name == "events.sqlite":
                    print("copying", file.parent, flush=True)
                    while not go.exists():
                        time.sleep(0.05)

            return super().backup(target, pages=1, progress=step, sleep=0)

    sqlite3.connect = lambda *a, **k: connect(*a, factory=_PageByPage, **k)
    from uprof.cli.main import app
    app()
    """
)


def test_a_sqlite_backup_killed_by_sigkill_inside_a_file_copy_is_removed_by_the_next(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The kill inside the copy of the event log itself (the backup API between two
    pages): the half-copied partial is removed by the next backup. SQLite only: on
    PostgreSQL the copy is ``pg_dump``, a process of its own writing the dump file."""
    if backend.kind != "sqlite":
        pytest.skip("the copy is pg_dump's, a process of its own")
    settings = filled_deployment(backend, clock, "bob")
    out = tmp_path / "out"
    child = PythonChild(
        _MID_COPY_BACKUP,
        str(tmp_path / "never"),
        "backup",
        "--to",
        str(out / "bk1"),
        env=cli_env(backend),
        stream_stdout=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    rest = child.communicate(timeout=60)
    assert line.startswith("copying"), (line, rest)
    partial = Path(line.split(" ", 1)[1].strip())
    assert partial.is_dir() and (partial / "events.sqlite").exists()
    assert child.returncode == -signal.SIGKILL
    made = run_python(
        CLI_SCRIPT, "backup", "--to", str(out / "bk2"), env=cli_env(backend), timeout=180
    )
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["bk2"]
    restore(settings, out / "bk2")
    assert_bob_intact(settings, clock, audit_verifies=True)
