"""Attacks on decision 0141 (exact erasure attribution, erasure outcomes), on SQLite and
PostgreSQL (decision 0145-review-of-0141)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import sqlalchemy.exc

from domain.errors import InvalidInputError
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, consented_settings, say, settings_for
from tests.kernel.test_key_material import _hold_in_flight
from tests.kernel.test_simultaneous_erasure_receipts import (
    Held,
    checked_offline,
    erase_capture_of,
    request_of,
)
from tests.kernel.test_two_erasures_at_once import outcomes_of_every_request
from uprof.crypto.keydir import FileKeyMaterialStore
from uprof.settings import Settings


def _storage_error(*args: Any, **kwargs: Any) -> Any:
    raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked"))


@pytest.mark.parametrize("step", ["preview", "ledger"])
def test_an_event_erasure_failing_at_its_key_preview_or_ledger_record_has_an_outcome(
    backend: Backend, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HX: GX gave ``erasure.failed`` to an event erasure failing at its ``CaptureErased``
    append, but its key preview and ledger record, still before the ledger holds it, sat
    outside ``_refusal_recorded``: a storage error there left the request without any
    outcome, and its in-flight mark was removed, so no start ever settled it."""
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(kernel, "alice")
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
        service = kernel.erasure_service
        if step == "preview":
            monkeypatch.setattr(service._keystore, "capture_key_commitment", _storage_error)
        else:
            ledger = service._keystore.ledger
            assert ledger is not None
            monkeypatch.setattr(ledger, "record_captures", _storage_error)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            kernel.erase_capture("alice", capture_id)
        monkeypatch.undo()
        outcomes = outcomes_of_every_request(kernel)
        assert list(outcomes.values()) == [["erasure.failed"]], outcomes  # main: [[]]
    finally:
        kernel.close()


def test_an_event_erasure_failing_at_its_ledger_record_asked_again_destroys_the_key(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HX, its residue: the failed request had appended ``CaptureErased`` (the views
    dropped the capture) but recorded nothing in the ledger and destroyed no key. Asked
    again, the erasure was refused ("no captured event"), and the capture key, and so the
    event, stayed readable until a subject erasure. A capture of this subject's stream
    whose key is still there is erased again: a new request, which destroys it."""
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(kernel, "alice")
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
        stream = str(kernel.subjects.find("alice").stream_id)
        ledger = kernel.erasure_service._keystore.ledger
        assert ledger is not None
        monkeypatch.setattr(ledger, "record_captures", _storage_error)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            kernel.erase_capture("alice", capture_id)
        monkeypatch.undo()
        assert kernel.keystore.capture_key_commitment(stream, capture_id) is not None
        receipt = kernel.erase_capture("alice", capture_id).receipt  # main: InvalidInputError
        assert kernel.keystore.capture_key_commitment(stream, capture_id) is None
        kinds = [a.get("key_kind") for a in receipt["body"]["actions"]]
        assert kinds.count("capture") == 1, receipt["body"]["actions"]
        outcomes = outcomes_of_every_request(kernel)
        assert sorted(map(sorted, outcomes.values())) == [
            ["erasure.failed"],
            ["projection.purged"],
        ], outcomes
        with pytest.raises(InvalidInputError):  # a capture of no key and no row: refused
            kernel.erase_capture("alice", "0" * 32)
    finally:
        kernel.close()


def test_a_mark_another_host_wrote_is_never_taken_for_dead(tmp_path: Path) -> None:
    """HY: the in-flight mark is an ``flock``, which many shared folders (NFS mounted
    ``local_lock=all`` or ``nolock``, SMB, some container volume drivers) keep per host. A
    request live on host A, its mark in a key folder host B shares, looked unheld from B,
    and B's start wrote ``erasure.abandoned`` for it; it then finished with a second
    outcome. The mark names its host, and a start judges only its own host's marks: a
    request dead on another host waits for a start there (fail safe)."""
    folder = tmp_path / "keys"
    store = FileKeyMaterialStore(folder)
    request_id = "0b7c3d4e-1f2a-4b5c-8d9e-0a1b2c3d4e5f"
    marks = folder / "erasures-in-flight"
    marks.mkdir(parents=True)
    # Host A's live request, its lock invisible here (not held on this host).
    (marks / f"{request_id}.lock").write_text("host=host-a.elsewhere.example\n")
    with store.erasure_owner_gone(request_id) as gone:
        assert gone is False  # main: True, and the start abandons a live request
    assert (marks / f"{request_id}.lock").exists()  # and leaves host A's mark alone
    # A mark this host's process left when it was killed is still judged here.
    ctx = children.CONTEXT
    held, done = ctx.Event(), ctx.Event()
    mine = "1c8d4e5f-2a3b-4c6d-9e0f-1b2c3d4e5f60"
    owner = ctx.Process(target=_hold_in_flight, args=(folder, mine, held, done))
    owner.start()
    assert held.wait(60)
    with store.erasure_owner_gone(mine) as gone:
        assert gone is False
    owner.kill()
    owner.join(60)
    with store.erasure_owner_gone(mine) as gone:
        assert gone is True


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return consented_settings(backend)


def test_two_event_erasures_of_one_capture_at_once_claim_its_key_once(
    settings: Settings,
) -> None:
    """HZ: two event erasures A and B of the same capture, at once (two real processes),
    both preview its key and write their ledger records; A's destroy deletes it, B's
    finds it gone. B claimed the key from its preview: the log held ``key.destroyed`` for
    the one key under A and under B, and B's receipt said B destroyed it. The key store
    says A's DELETE removed it (``destroyed_capture_keys``): B cites it ``by_request`` A."""
    kernel = build_kernel(settings, FakeClock())
    try:
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
    finally:
        kernel.close()
    call = functools.partial(erase_capture_of, capture_id)
    a = Held(settings, "after-requested", "before-capture-destroy", call=call)
    b = Held(settings, "after-requested", "before-capture-destroy", call=call)
    a.begin()  # each found the capture in the views: two requests, neither resumes the other
    b.begin()
    a.next()  # A: CaptureErased appended, key previewed, ledger record written
    b.next()  # B: the same, the key still there
    kind, first = a.answer()
    assert kind == "ok", first
    kind, second = b.answer()
    assert kind == "ok", second
    r_a = request_of(first)
    capture_keys = [x for x in second["body"]["actions"] if x.get("key_kind") == "capture"]
    assert [k.get("by_request") for k in capture_keys] == [r_a], second["body"][
        "actions"
    ]  # main: [None]
    log = checked_offline(settings, first, second)
    assert [r for r, _ in log["destroyed"]] == [r_a], log  # main: A's and B's
    assert len(log["outcomes"]) == 2 and all(log["outcomes"].values()), log


def _uprof(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """This tree's ``uprof`` CLI, in its own process, on the test's stores.

    The process is forked from the tests' fork server (``tests.children``), which has the
    project imported: a fresh interpreter paid those imports again for each of the ~100
    commands the callers run (0.7-1.2 s of CPU each). The command itself, from its
    argument parsing and its start on the stores to its exit code, runs in the child."""
    where = ["--data-dir", str(settings.data_dir), "--embedder", "hashing"]
    if settings.database_url:
        where += ["--database-url", settings.database_url]
    code = "import sys; from uprof.cli.main import app; sys.argv[0] = 'uprof'; app()"
    return children.run_python(code, *where, *args, timeout=120)


def test_a_receipt_citing_another_event_erasures_capture_key_verifies_with_the_cli(
    settings: Settings, tmp_path: Path
) -> None:
    """HZ's receipt (a capture ``dek_destroyed`` with ``by_request``) verifies offline with
    ``uprof audit verify-receipt``, and one with that ``by_request`` altered does not."""
    kernel = build_kernel(settings, FakeClock())
    try:
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
    finally:
        kernel.close()
    call = functools.partial(erase_capture_of, capture_id)
    a = Held(settings, "after-requested", "before-capture-destroy", call=call)
    b = Held(settings, "after-requested", "before-capture-destroy", call=call)
    a.begin()
    b.begin()
    a.next()
    b.next()
    assert a.answer()[0] == "ok"
    kind, second = b.answer()
    assert kind == "ok", second
    assert any("by_request" in x for x in second["body"]["actions"] if x.get("key_kind"))
    key = tmp_path / "audit.pem"
    made = _uprof(settings, "audit", "public-key", "--out", str(key))
    assert made.returncode == 0, made.stderr
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(second))
    checked = _uprof(settings, "audit", "verify-receipt", str(path), "--public-key", str(key))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for action in second["body"]["actions"]:
        if action.get("key_kind") == "capture" and "by_request" in action:
            action["by_request"] = "00000000-0000-4000-8000-000000000000"
    path.write_text(json.dumps(second))
    altered = _uprof(settings, "audit", "verify-receipt", str(path), "--public-key", str(key))
    assert altered.returncode == 1, altered.stdout + altered.stderr


@pytest.mark.parametrize("planted", ["directory", "fifo", "symlink"])
def test_a_hostile_file_planted_as_a_mark_neither_stops_a_start_nor_is_followed(
    tmp_path: Path, planted: str
) -> None:
    """IA: a start reads the mark of every request the log leaves open. A directory planted
    under a logged request's mark name made ``erasure_owner_gone`` raise
    (``IsADirectoryError``), and every start failed; a FIFO or a symlink was opened like
    a lock file (a FIFO could block the read of its host line; a symlink was followed out
    of the folder). Anything but a regular file is not a mark: left alone, never judged."""
    folder = tmp_path / "keys"
    store = FileKeyMaterialStore(folder)
    request_id = "2d9e5f60-3b4c-4d7e-8f10-2c3d4e5f6071"
    marks = folder / "erasures-in-flight"
    marks.mkdir(parents=True)
    path = marks / f"{request_id}.lock"
    outside = tmp_path / "elsewhere"
    outside.write_text("")
    if planted == "directory":
        path.mkdir()
    elif planted == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(outside)
    with store.erasure_owner_gone(request_id) as gone:  # main: IsADirectoryError
        assert gone is False
    assert path.exists() or path.is_symlink()
    assert outside.read_text() == ""


def test_a_downgrade_of_0006_under_a_live_erasure_destroys_no_key_without_its_row(
    settings: Settings,
) -> None:
    """Held: the keys migration 0006 downgraded (its two tables dropped) while another
    process's subject erasure sits between its ledger record and its destroy. That
    destroy fails on the missing table and rolls back: no key goes without its
    ``destroyed_keys`` row. The next start migrates to head and re-applies the ledger; the
    erasure asked again is finished, its receipt verifying offline, one outcome."""
    from alembic import command
    from alembic.config import Config

    from uprof.storage import MIGRATIONS_DIR

    before = build_kernel(settings, FakeClock())
    try:
        stream = str(before.subjects.find("alice").stream_id)
        url = before.keystore._engine.url
    finally:
        before.close()
    held = Held(settings, "before-destroy")
    held.begin()  # its ledger record written, its keys not yet destroyed
    # The operator's downgrade, from outside uprof (a start here would re-apply the
    # ledger and destroy the keys itself).
    engine = sa.create_engine(url)
    try:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["branch"] = "keys"
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0005_keys_plain_row_keys")
    finally:
        engine.dispose()
    kind, answer = held.answer()
    assert kind == "error", answer  # its destroy failed on the missing table
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            left = conn.execute(
                sa.text("SELECT count(*) FROM subject_keys WHERE stream_id = :s"), {"s": stream}
            ).scalar_one()
    finally:
        engine.dispose()
    assert left > 0  # rolled back with the failed row insert: no key gone unrecorded
    kernel = build_kernel(settings, FakeClock())  # a start: migrates, re-applies the ledger
    try:
        assert not kernel.keystore.destruction_preview(stream).deks
        receipt = kernel.erase_subject("alice").receipt
    finally:
        kernel.close()
    log = checked_offline(settings, receipt)
    assert list(log["outcomes"].values()) == [["projection.purged"]], log
