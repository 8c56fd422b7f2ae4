"""Keys apart from data, backup/restore with the erasure ledger, erased subject ids.

Decision 0012; issue 14 (a pre-erasure copy of the data folder stayed readable) and
issue 13 (an erased subject id came back with the same pseudonym). Both backends.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa

from domain.errors import InvalidInputError, SubjectErasedError, SubjectNotFoundError
from tests.conftest import POSTGRES_ADMIN_URL, Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, say, settings_for
from uprof.bootstrap import AuditLogBehindError, RestoreInterruptedError
from uprof.crypto.keydir import (
    LEDGER_FILE,
    KeyMaterialError,
    move_key_material,
)
from uprof.kernel import Uprof
from uprof.services.backup import KEY_TABLES, BackupError, _sign, backup, restore
from uprof.services.subjects import SubjectRequest
from uprof.settings import Settings
from uprof.storage import RESTORE_MARKER


def canaries(tag: str) -> dict[str, str]:
    return {
        "attribute": f"Qzx{tag}town",
        "memory": f"Qzx{tag}friend",
        "intent": f"qzx{tag}dance",
        "capture": f"Qzx{tag}note",
        "source_ref": f"Qzx{tag}ref",
    }


ALICE, BOB = canaries("alice"), canaries("bob")
SUBJECTS = {"alice": ALICE, "bob": BOB}


def fill(kernel: Uprof, subject: str, c: dict[str, str]) -> None:
    consent(kernel, subject=subject)
    kernel.capture_many(
        subject,
        [
            say(f"I live in {c['attribute']}", ref=c["source_ref"]),
            say(f"Yesterday I met {c['memory']} at the market"),
            say(f"I want to {c['intent']} next spring"),
            say(f"note {c['capture']}"),
        ],
    )
    kernel.process()


def scan_bytes(root: Path, terms: list[str]) -> list[str]:
    """Raw byte scan of every file under root (closed stores only)."""
    hits = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        hits += [
            f"{path.name}:{t}" for t in terms if t.encode() in data or t.encode("utf-16-le") in data
        ]
    return hits


def audit_entries(kernel: Uprof, path: Path) -> list[dict]:
    kernel.export_audit(path)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [line["entry"] for line in lines if line.get("kind") == "entry"]


def slice_text(kernel: Uprof, subject: str) -> str:
    result = kernel.slice(
        subject,
        "where do I live, who did I meet, what do I want",
        budget_tokens=800,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
    )
    return result.text


def assert_erased_everywhere(kernel: Uprof, subject: str, terms: list[str], tmp: Path) -> None:
    """Every read path refuses the subject, and no output or store holds a canary."""
    for read in (
        lambda: kernel.profile(subject),
        lambda: slice_text(kernel, subject),
        lambda: kernel.evidence(subject, "x"),
        lambda: kernel.export_subject(subject),
        lambda: kernel.capture(subject, say("hello again")),
        lambda: kernel.grant_consent(
            subject, app_id=APP, categories=["*"], purposes=["personalization"]
        ),
        lambda: kernel.erase_subject(subject),
        lambda: kernel.register_session("s-new", subject),
    ):
        with pytest.raises(SubjectErasedError):
            read()
    out = tmp / "trail.jsonl"
    kernel.export_audit(out)
    trail = out.read_text(encoding="utf-8")
    assert not [t for t in terms if t in trail]
    report = kernel.residue_scan(terms)
    assert report.clean, report.findings


def assert_intact(kernel: Uprof, subject: str, c: dict[str, str]) -> None:
    view = kernel.profile(subject)
    assert c["attribute"] in [a.value for a in view.attributes]
    served = slice_text(kernel, subject)
    assert any(v in served for v in c.values()), served  # ranking picks which
    export = json.dumps(kernel.export_subject(subject))
    assert all(v in export for v in c.values())
    item = view.attributes[0].item_id
    assert kernel.evidence(subject, item).captures


def filled_deployment(backend: Backend, clock: FakeClock, *subjects: str) -> Settings:
    """A closed deployment holding the canaries of each subject (alice's or bob's): the
    store a backup, restore, upgrade or copy test starts from."""
    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    for subject in subjects:
        fill(k, subject, SUBJECTS[subject])
    k.close()
    return settings


def assert_bob_intact(settings: Settings, clock: FakeClock, *, audit_verifies: bool) -> None:
    """One start of the deployment serves bob whole (and, asked, its audit log verifies):
    what a refused, killed or finished restore must leave behind."""
    k = build_kernel(settings, clock)
    try:
        assert_intact(k, "bob", BOB)
        if audit_verifies:
            k.audit_log.verify_integrity()
    finally:
        k.close()


# ------------------------------------------------------------------ placement


def test_key_material_lives_apart_from_the_data_folder(kernel: Uprof) -> None:
    s = kernel.settings
    assert s.key_path == s.data_dir.resolve().with_name(s.data_dir.name + ".keys")
    kept = {p.name for p in s.key_path.iterdir()}
    assert {"master.key", "keks.json", "audit-signing.pem"} <= kept
    if s.data_dir.exists():  # PostgreSQL deployments need no data folder at all
        assert not [p.name for p in s.data_dir.iterdir() if p.name in kept]
    if s.database_url is None:
        assert "keys.sqlite" in kept
        assert str(s.key_path) in kernel.keys_engine.url.database
    assert (s.key_path.stat().st_mode & 0o077) == 0


@pytest.mark.parametrize("relation", ["inside", "same", "contains"])
def test_a_key_dir_inside_or_around_the_data_dir_is_refused(tmp_path: Path, relation: str) -> None:
    data = tmp_path / "data"
    key_dir = {"inside": data / "keys", "same": data, "contains": tmp_path}[relation]
    with pytest.raises(ValueError, match="key_dir"):
        Settings(data_dir=data, key_dir=key_dir)


def test_legacy_key_files_in_the_data_folder_are_refused_then_moved(
    backend: Backend, clock: FakeClock
) -> None:
    settings = filled_deployment(backend, clock, "alice")
    # An older uprof kept the key files in the data folder: put them back there.
    legacy = ["master.key", "keks.json", "audit-signing.pem"]
    if backend.kind == "sqlite":
        legacy.append("keys.sqlite")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    for name in legacy:
        os.replace(settings.key_path / name, settings.data_dir / name)
    with pytest.raises(KeyMaterialError, match="UPROF_KEY_DIR"):
        build_kernel(settings, clock)
    assert sorted(move_key_material(settings.data_dir, settings.key_path)) == sorted(legacy)
    assert not [p for p in legacy if (settings.data_dir / p).exists()]
    k = build_kernel(settings, clock)
    try:
        assert_intact(k, "alice", ALICE)
    finally:
        k.close()


def test_moving_key_files_never_overwrites_the_key_folder(tmp_path: Path) -> None:
    data, keys = tmp_path / "data", tmp_path / "data.keys"
    data.mkdir()
    keys.mkdir()
    (data / "master.key").write_bytes(b"a" * 32)
    (keys / "master.key").write_bytes(b"b" * 32)
    with pytest.raises(KeyMaterialError, match="refusing to choose"):
        move_key_material(data, keys)
    assert (keys / "master.key").read_bytes() == b"b" * 32


# ------------------------------------------------------------------ the attacks


def test_a_copy_of_the_data_taken_before_erasure_stays_erased(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Issue 14: `export-subject` on a pre-erasure copy recovered 36 of 43 canaries."""
    settings = filled_deployment(backend, clock, "alice", "bob")
    copy_settings = _copy_deployment(backend, settings, tmp_path)
    k = build_kernel(settings, clock)
    try:
        k.erase_subject("alice")
    finally:
        k.close()
    # The attacker starts uprof on the pre-erasure copy with the live key folder: its
    # audit log is behind the checkpoint the folder keeps, so the start is refused (bug
    # HT). Holding the key folder, they delete the note and start again.
    with pytest.raises(AuditLogBehindError, match=r"audit-checkpoint\.note"):
        build_kernel(copy_settings, clock).close()
    (settings.key_path / "audit-checkpoint.note").unlink()
    k = build_kernel(copy_settings, clock)
    try:
        assert_erased_everywhere(k, "alice", list(ALICE.values()), tmp_path)
        assert_intact(k, "bob", BOB)
    finally:
        k.close()
    if backend.kind == "sqlite":
        assert scan_bytes(copy_settings.data_dir, list(ALICE.values())) == []


def _copy_deployment(backend: Backend, settings: Settings, tmp_path: Path) -> Settings:
    """A raw copy of the data (and, on PostgreSQL, of the whole database: key tables too)."""
    if backend.kind == "sqlite":
        target = tmp_path / "copy"
        shutil.copytree(settings.data_dir, target)
        return Settings(data_dir=target, key_dir=settings.key_path, embedder="hashing")
    name = f"{backend.pg_dbname}_copy"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{backend.pg_dbname}"'))
    finally:
        admin.dispose()
    url = sa.engine.make_url(backend.url).set(database=name)
    _PG_COPIES.append(name)
    return Settings(
        data_dir=settings.data_dir,
        key_dir=settings.key_path,
        database_url=url.render_as_string(hide_password=False),
        embedder="hashing",
    )


_PG_COPIES: list[str] = []


@pytest.fixture(autouse=True)
def _drop_pg_copies():
    yield
    if _PG_COPIES:
        admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                while _PG_COPIES:
                    conn.execute(
                        sa.text(f'DROP DATABASE IF EXISTS "{_PG_COPIES.pop()}" WITH (FORCE)')
                    )
        finally:
            admin.dispose()


def test_a_restored_key_database_cannot_resurrect_an_erased_subject(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The wrapped DEKs of a pre-erasure key-database copy are destroyed at the next start."""
    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    fill(k, "alice", ALICE)
    stream = str(k.stream_of("alice"))
    old_keys = k.keystore.key(stream, 1)
    k.close()
    if backend.kind == "sqlite":
        saved = tmp_path / "keys-before.sqlite"
        shutil.copy2(settings.key_path / "keys.sqlite", saved)
    k = build_kernel(settings, clock)
    if backend.kind == "postgres":
        with k.keys_engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT * FROM subject_keys")).mappings().all()
    k.erase_subject("alice")
    k.close()
    # Put the pre-erasure wrapped key back, as restoring the key database would.
    if backend.kind == "sqlite":
        shutil.copy2(saved, settings.key_path / "keys.sqlite")
    else:
        engine = sa.create_engine(backend.url)
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM shredded_streams"))
            for row in rows:
                conn.execute(
                    sa.text(
                        "INSERT INTO subject_keys VALUES (:stream_id, :key_version, "
                        ":wrapped_dek, :kek_id, :dek_commitment, :created_at)"
                    ),
                    dict(row),
                )
        engine.dispose()
    k = build_kernel(settings, clock)
    try:
        assert old_keys is not None
        assert k.keystore.key(stream, 1) is None
        assert k.keystore.is_shredded(stream)
        assert_erased_everywhere(k, "alice", list(ALICE.values()), tmp_path)
    finally:
        k.close()


# ------------------------------------------------------------------ backup / restore


def test_backup_erase_restore_keeps_the_erased_subject_erased(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    fill(k, "alice", ALICE)
    fill(k, "bob", BOB)
    master, keks = k.keystore._index_key, k.keystore._ring.keys
    k.close()
    report = backup(settings, tmp_path / "bk")
    assert report.audit_entries > 0
    # No key material in the backup: no secret, no KEK, no key table.
    blob = b"".join(p.read_bytes() for p in (tmp_path / "bk").iterdir())
    key_files = ("master.key", "keks.json", "audit-signing.pem")
    for secret in [*(settings.key_path / n for n in key_files)]:
        assert secret.read_bytes() not in blob
    assert all(kek not in blob for kek in keks.values()) and master not in blob
    assert b"subject_keys" not in blob and b"capture_keys" not in blob
    k = build_kernel(settings, clock)
    k.erase_subject("alice")
    k.close()
    result = restore(settings, tmp_path / "bk")
    assert result.audit_kept_live
    assert result.ledger.erased_streams == 1
    assert result.ledger.view_rows > 0  # the backup held the subject's (sealed) rows
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    k = build_kernel(settings, clock)
    try:
        assert_erased_everywhere(k, "alice", list(ALICE.values()), tmp_path)
        assert_intact(k, "bob", BOB)
        # The erasure's audit entries survived the restore and the log verifies.
        k.audit_log.verify_integrity()
        actions = [e["action"] for e in audit_entries(k, tmp_path / "all.jsonl")]
        assert "erasure.requested" in actions and "key.destroyed" in actions
        # Restoring leaves nothing half-done: once caught up (the reads served above
        # written and projected), the views equal a rebuild from the log.
        assert k.ensure_fresh(30)
        live = k.queries.table_digest()
        k.rebuild()
        assert k.queries.table_digest() == live
    finally:
        k.close()
    assert scan_bytes(tmp_path / "bk", list(ALICE.values()) + list(BOB.values())) == []
    if backend.kind == "sqlite":
        assert scan_bytes(settings.data_dir, list(ALICE.values())) == []


def test_restore_into_an_empty_deployment_with_the_key_folder(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Disaster recovery: the data folder (or database) is gone, the key folder is not."""
    settings = filled_deployment(backend, clock, "bob")
    backup(settings, tmp_path / "bk")
    if backend.kind == "sqlite":
        shutil.rmtree(settings.data_dir)
    else:
        engine = sa.create_engine(backend.url)
        with engine.begin() as conn:
            for table in sa.inspect(conn).get_table_names():
                if table not in (*KEY_TABLES, "alembic_version"):  # every key table kept
                    conn.execute(sa.text(f'DROP TABLE "{table}" CASCADE'))
        engine.dispose()
    result = restore(settings, tmp_path / "bk")
    assert not result.audit_kept_live
    assert_bob_intact(settings, clock, audit_verifies=True)


def test_restore_refuses_a_tampered_backup_and_changes_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = filled_deployment(backend, clock, "bob")
    backup(settings, tmp_path / "bk")
    victim = next(p for p in (tmp_path / "bk").iterdir() if p.name != "manifest.json")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(InvalidInputError, match="checksum"):
        restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    with pytest.raises(InvalidInputError, match="must not be inside"):
        backup(settings, settings.key_path / "bk")
    with pytest.raises(InvalidInputError, match="not empty"):
        backup(settings, tmp_path / "bk")


def test_restore_refuses_an_audit_log_it_would_fork(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = filled_deployment(backend, clock, "bob")
    backup(settings, tmp_path / "bk")
    manifest = json.loads((tmp_path / "bk" / "manifest.json").read_text())
    manifest["audit"]["last_leaf_hash"] = "00" * 32  # another deployment's log
    del manifest["signature"]
    _sign(settings, manifest)  # signed as written: the fork check, not the signature, refuses
    (tmp_path / "bk" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="fork"):
        restore(settings, tmp_path / "bk")


def test_an_interrupted_restore_blocks_every_start(backend: Backend, clock: FakeClock) -> None:
    settings = settings_for(backend)
    build_kernel(settings, clock).close()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    (settings.data_dir / RESTORE_MARKER).write_text("{}")
    with pytest.raises(RestoreInterruptedError, match="restore"):
        build_kernel(settings, clock)


# ------------------------------------------------------------------ erased subject ids


def test_an_erased_subject_id_is_refused_until_recreated_with_a_fresh_pseudonym(
    kernel: Uprof, tmp_path: Path
) -> None:
    """Issue 13: grant and capture after erasure succeeded with the *same* pseudonym."""
    fill(kernel, "alice", ALICE)
    old = kernel.subjects.find("alice")
    assert old is not None
    kernel.erase_subject("alice")
    assert_erased_everywhere(kernel, "alice", list(ALICE.values()), tmp_path)
    with pytest.raises(SubjectNotFoundError):
        kernel.profile("carol")  # unknown is not erased
    with pytest.raises(InvalidInputError):
        kernel.recreate_subject("carol")
    new_pseudonym = kernel.recreate_subject("alice", requested_by="operator:dpo")
    assert new_pseudonym != old.pseudonym
    consent(kernel, subject="alice")
    kernel.capture("alice", say("I live in Oslo"))
    kernel.process()
    new = kernel.subjects.find("alice")
    assert new is not None and new.stream_id != old.stream_id
    assert new.pseudonym == new_pseudonym
    assert [a.value for a in kernel.profile("alice").attributes] == ["Oslo"]
    # The audit log: old entries keep the old pseudonym, new ones the new; none joins them.
    refs = [e.get("subject_ref") for e in audit_entries(kernel, tmp_path / "t.jsonl")]
    assert old.pseudonym in refs and new_pseudonym in refs
    kernel.audit_log.verify_integrity()
    assert kernel.audit_subject_ref("alice") == new_pseudonym
    # Erasing the re-created subject marks the id again.
    kernel.erase_subject("alice")
    with pytest.raises(SubjectErasedError):
        kernel.capture("alice", say("again"))


def test_refused_captures_link_to_nothing(kernel: Uprof, tmp_path: Path) -> None:
    from domain.errors import ConsentRequiredError

    for _ in range(2):
        with pytest.raises(ConsentRequiredError):
            kernel.capture("dave", say("hi"))
    fill(kernel, "erin", BOB)
    kernel.erase_subject("erin")
    with pytest.raises(SubjectErasedError):
        kernel.capture("erin", say("hi"))
    consent(kernel, subject="dave")
    dave = kernel.subjects.find("dave")
    assert dave is not None
    entries = audit_entries(kernel, tmp_path / "t.jsonl")
    refused = [e for e in entries if e.get("action") == "capture.refused"]
    assert [e["reason_code"] for e in refused] == [
        "no-consent-on-record",
        "no-consent-on-record",
        "subject-erased",
    ]
    refs = [e["subject_ref"] for e in refused]
    # Fresh each time: no stable keyed hash of the name joins the attempts to each
    # other, to the subject created later, or to the erased one.
    assert len(set(refs)) == 3 and dave.pseudonym not in refs
    erin_refs = {e.get("subject_ref") for e in entries if e.get("action") == "erasure.requested"}
    assert not erin_refs & set(refs)


def test_an_erasure_in_another_process_is_seen_by_a_running_one(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    first = build_kernel(settings, clock)
    second = build_kernel(settings, clock)
    try:
        fill(first, "alice", ALICE)
        second.profile("alice")
        first.erase_subject("alice")
        with pytest.raises(SubjectErasedError):
            second.grant_consent(
                "alice", app_id=APP, categories=["*"], purposes=["personalization"]
            )
        with pytest.raises(SubjectErasedError):
            second.slice(
                SubjectRequest(subject="alice"),
                "x",
                budget_tokens=100,
                purpose="personalization",
                app_id=APP,
                agent_id="agent:one",
            )
    finally:
        second.close()
        first.close()


def test_a_torn_ledger_line_is_skipped_and_the_next_append_stays_whole(
    kernel: Uprof,
) -> None:
    fill(kernel, "alice", ALICE)
    ledger_path = kernel.settings.key_path / LEDGER_FILE
    with ledger_path.open("ab") as fh:
        fh.write(b'{"v":1,"kind":"subj')  # a process killed mid-append
    assert kernel.keystore.ledger is not None
    assert kernel.keystore.ledger.state().streams == frozenset()
    kernel.erase_subject("alice")
    assert kernel.subjects.is_erased("alice")
    lines = ledger_path.read_bytes().split(b"\n")
    assert lines[0] == b'{"v":1,"kind":"subj' and json.loads(lines[1])["kind"] == "subject"


def test_an_import_never_writes_to_an_erased_subject(kernel: Uprof) -> None:
    from uprof.services.importer import import_interactions

    fill(kernel, "alice", ALICE)
    consent(kernel, subject="bob")
    kernel.erase_subject("alice")
    before = kernel.app.max_notification_id()
    line = {
        "app_id": APP,
        "agent_id": "agent:one",
        "user_input": "hi",
        "occurred_at": "2026-02-01T10:00:00Z",
    }
    lines = [json.dumps({"subject": s, **line}) for s in ("bob", "alice")]
    strict = import_interactions(kernel, lines, strict=True)
    assert strict.refused and [p.where for p in strict.failed] == ["line 2"]
    assert "erased" in strict.failed[0].message
    assert kernel.app.max_notification_id() == before
    # Per record (the default): bob's line is captured, alice's is reported, not revived.
    report = import_interactions(kernel, lines)
    assert report.captured == 1 and [p.where for p in report.failed] == ["line 2"]
    assert kernel.subjects.is_erased("alice")


def test_an_empty_key_folder_beside_an_existing_log_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A wrong UPROF_KEY_DIR must not mint new keys over an old log: every subject would
    look erased, and new captures would go under keys that open nothing of the old ones."""
    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    consent(k)
    k.capture("alice", say("I live in Porto"))
    k.close()
    wrong = tmp_path / "elsewhere.keys"
    moved = settings.model_copy(update={"key_dir": wrong})
    with pytest.raises(KeyMaterialError, match="holds no master key") as refused:
        build_kernel(moved, clock)
    assert "UPROF_KEY_DIR" in str(refused.value)
    assert not (wrong / "master.key").exists()  # nothing was created there
    # The right folder still opens everything.
    k = build_kernel(settings, clock)
    try:
        assert k.subject_exists("alice")
    finally:
        k.close()
