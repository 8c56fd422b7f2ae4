"""An audit log put back from an older copy is not signed over (bug HE).

The audit log lives in the views store (``views.sqlite``; on PostgreSQL, tables beside the
views). An older copy of it put back (a volume snapshot rolled back, a file copied over the
live one; on PostgreSQL the newer rows deleted past the triggers) lost the entries written
since, and nothing in the deployment noticed: the next ``uprof audit checkpoint`` signed a
tree that contradicts the checkpoint the same key had signed before (a fork, under the
deployment's own signature), and ``verify_integrity`` passed. The key folder now keeps the
newest checkpoint the log signed; a log that does not extend it is refused a checkpoint and
fails its integrity check, naming the rollback. Each CLI call below is its own start of the
deployment (a fresh kernel), as separate processes are.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from audit.errors import VerificationError
from audit.log import AuditLog
from audit.tables import audit_checkpoints, audit_entries, audit_nodes
from tests.api.test_audit_proofs import cli_for
from tests.conftest import Backend
from uprof.backends import backend_for
from uprof.crypto.keydir import FileKeyMaterialStore


def _copy_sqlite(src: Path, dest: Path) -> None:
    """A consistent copy of a live SQLite file (the backup API), as a snapshot tool makes."""
    with sqlite3.connect(src) as source, sqlite3.connect(dest) as target:
        source.backup(target)
    source.close()
    target.close()


def _views_url(backend: Backend) -> str:
    if backend.kind == "sqlite":
        return f"sqlite:///{backend.data_dir / 'data' / 'views.sqlite'}"
    return backend.url


def _size(backend: Backend) -> int:
    engine = sa.create_engine(_views_url(backend))
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(sa.select(sa.func.count()).select_from(audit_entries)).scalar_one()
            )
    finally:
        engine.dispose()


def _cut_to(backend: Backend, size: int) -> None:
    """PostgreSQL: what restoring an older dump of the audit tables leaves, done with
    the rows (the triggers that refuse DELETE switched off, as an administrator can)."""
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            conn.execute(audit_entries.delete().where(audit_entries.c.leaf_index >= size))
            # A node at (level, index) covers leaves [index << level, (index + 1) << level).
            conn.execute(
                audit_nodes.delete().where(
                    (audit_nodes.c.node_index + 1) * sa.func.power(2, audit_nodes.c.level) > size
                )
            )
            conn.execute(audit_checkpoints.delete().where(audit_checkpoints.c.tree_size > size))
    finally:
        engine.dispose()


def _roll_back(backend: Backend, older: Path, size: int) -> None:
    if backend.kind == "sqlite":
        live = backend.data_dir / "data" / "views.sqlite"
        for side in ("-wal", "-shm"):
            Path(f"{live}{side}").unlink(missing_ok=True)
        _copy_sqlite(older, live)
    else:
        _cut_to(backend, size)
    assert _size(backend) == size


def test_a_log_put_back_from_an_older_copy_is_refused_a_checkpoint(
    backend: Backend, tmp_path: Path
) -> None:
    run = cli_for(backend)
    for n in range(3):
        run("apps", "create", f"app:a{n}")  # audited writes
    older = tmp_path / "views-older.sqlite"
    if backend.kind == "sqlite":
        _copy_sqlite(backend.data_dir / "data" / "views.sqlite", older)
    old_size = _size(backend)
    for n in range(3, 6):
        run("apps", "create", f"app:a{n}")
    held = tmp_path / "held.note"
    run("audit", "checkpoint", "--out", str(held))
    signed_size = int(held.read_text().split("\n")[1])
    assert signed_size > old_size

    _roll_back(backend, older, old_size)
    # No start goes on from the older copy (bug HT): every command is refused, naming
    # the rollback and the checkpoint the key folder keeps.
    out = run("apps", "create", "app:after", code=1)
    assert "audit-checkpoint.note" in out, out
    forked = tmp_path / "forked.note"
    out = run("audit", "checkpoint", "--out", str(forked), code=1)
    assert "rolled back" in out and str(signed_size) in out, out
    assert not forked.exists()

    # The integrity check, in another start, names it too.
    engine = sa.create_engine(_views_url(backend))
    keys = FileKeyMaterialStore(backend.data_dir / "data.keys").audit_keys()
    try:
        log = AuditLog(engine, keys, "uprof.local/audit", backend=backend_for(engine), anchor=keys)
        with pytest.raises(VerificationError, match="rolled back"):
            log.verify_integrity()
    finally:
        engine.dispose()


def test_two_processes_appending_and_signing_at_once_are_never_refused(
    backend: Backend, tmp_path: Path
) -> None:
    """The anchor is read before the log: a process whose size read precedes another
    process's append and checkpoint must not take the larger anchored checkpoint for a
    rollback. Two real processes append and sign in a loop; none is refused, the log
    verifies, and the key folder keeps the largest checkpoint signed."""
    from tests.kernel.conftest import settings_for
    from tests.kernel.test_audit_key_rotation_processes import child

    go = tmp_path / "go"
    body = f"""
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        Path({str(tmp_path)!r}, f"ready-{{os.getpid()}}").touch()
        while not Path({str(go)!r}).exists():
            time.sleep(0.005)
        sizes = []
        for i in range(40):
            kernel.audit.record("consent.granted", subject_ref=f"subj_{{os.getpid()}}_{{i}}")
            sizes.append(kernel.audit_log.checkpoint_record().tree_size)
        print(json.dumps(sizes))
    finally:
        kernel.close()
    """
    processes = [child(backend, body) for _ in range(2)]
    try:
        from tests.kernel.test_audit_key_rotation_processes import wait_for

        for process in processes:
            wait_for(tmp_path / f"ready-{process.pid}", process)
        go.touch()
        outputs = [process.communicate(timeout=300) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, (_out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-3000:]
    signed = max(max(json.loads(out)) for out, _ in outputs)

    engine = sa.create_engine(_views_url(backend))
    keys = FileKeyMaterialStore(settings_for(backend).key_path).audit_keys()
    try:
        log = AuditLog(engine, keys, "uprof.local/audit", backend=backend_for(engine), anchor=keys)
        assert log.verify_integrity() == log.size() >= 80
        note = keys.anchored_checkpoint()
        assert note is not None and int(note.split("\n")[1]) == signed
    finally:
        engine.dispose()


def test_exports_taken_while_another_process_appends_verify_and_extend_each_other(
    backend: Backend, tmp_path: Path
) -> None:
    """Held (both backends): each export is bounded by the checkpoint it signs first, so
    a writer in another process appending throughout changes nothing in it; every export
    verifies offline, and each one extends the checkpoints of those before it."""
    from audit.export import export_jsonl
    from audit.keys import public_key_pem
    from audit.verify import verify_export
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import running, settings_for
    from tests.kernel.test_audit_key_rotation_processes import child, wait_for

    stop = tmp_path / "stop"
    writer = child(
        backend,
        f"""
        kernel = build_kernel(settings_for(backend), FakeClock())
        try:
            Path({str(tmp_path)!r}, "writing").touch()
            i = 0
            while not Path({str(stop)!r}).exists():
                kernel.audit.record("consent.granted", subject_ref=f"subj_w{{i}}")
                i += 1
            print(i)
        finally:
            kernel.close()
        """,
    )
    trusted: list[str] = []
    sizes: list[int] = []
    try:
        wait_for(tmp_path / "writing", writer)
        with running(settings_for(backend), FakeClock()) as kernel:
            pem = public_key_pem(kernel.audit_log.public_key)
            for n in range(4):
                path = tmp_path / f"export-{n}.jsonl"
                summary = export_jsonl(kernel.audit_log, path)
                report = verify_export(
                    path, pem, kernel.settings.audit_origin, trusted_checkpoints=trusted
                )
                assert report.tree_size == summary.tree_size == report.entry_count
                trusted.append(summary.checkpoint)
                sizes.append(summary.tree_size)
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err[-3000:]
    assert int(out) > 0 and sizes == sorted(sizes) and sizes[-1] > sizes[0]


def test_a_process_killed_while_appending_and_signing_leaves_a_log_that_extends_its_anchor(
    backend: Backend, tmp_path: Path
) -> None:
    """SIGKILL at a random point of a loop of appends and checkpoints (inside an append's
    transaction, between a checkpoint's row and its anchor, inside the anchor's write):
    the log still verifies against the anchor, the next checkpoint is signed and anchored,
    and no temporary anchor file is left once it is."""
    import random
    import signal
    import time

    from tests.kernel.conftest import settings_for
    from tests.kernel.test_audit_key_rotation_processes import child, wait_for

    keys = FileKeyMaterialStore(settings_for(backend).key_path).audit_keys()
    for run in range(3):
        ready = tmp_path / f"ready-{run}"
        process = child(
            backend,
            f"""
            kernel = build_kernel(settings_for(backend), FakeClock())
            Path({str(ready)!r}).touch()
            i = 0
            while True:
                kernel.audit.record("consent.granted", subject_ref=f"subj_{run}_{{i}}")
                kernel.audit_log.checkpoint_record()
                i += 1
            """,
        )
        try:
            wait_for(ready, process)
            time.sleep(random.uniform(0.05, 0.4))
            process.send_signal(signal.SIGKILL)
            process.wait()
        finally:
            if process.poll() is None:
                process.kill()
        engine = sa.create_engine(_views_url(backend))
        try:
            log = AuditLog(
                engine, keys, "uprof.local/audit", backend=backend_for(engine), anchor=keys
            )
            size = log.verify_integrity()
            assert log.checkpoint_record().tree_size == size
            note = keys.anchored_checkpoint()
            assert note is not None and int(note.split("\n")[1]) == size
            assert not list(keys.folder.glob(".audit-checkpoint.note.*.tmp"))
        finally:
            engine.dispose()
