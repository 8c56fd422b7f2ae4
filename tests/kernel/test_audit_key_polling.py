"""Polling the audit key reuses the stored checkpoint while the log has not grown.

``GET /v1/audit/key`` (``Facade.audit_key``) hands a holder of the ``audit`` right a
checkpoint of the current log. Until 2026-12-05 every call signed one and tried to store
it: the table's key (``tree_size``) kept a second row for one size out, but each poll still
opened a write transaction on the audit store and had it refused (on SQLite, the database's
write lock, which every append waits for). A poll of an unchanged log now finds the stored
checkpoint of that size and writes nothing; an append gives the next poll a new one, which
still covers the whole log (what an offline verifier and a proof from it need). Both
backends; two real processes polling at once store one checkpoint per size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from audit.checkpoint import verify_checkpoint
from domain.principal import Principal
from tests.children import PythonChild
from tests.conftest import Backend
from uprof.facade import Facade
from uprof.kernel import Uprof


def _stored(kernel: Uprof) -> list[int]:
    return [c.tree_size for c in kernel.audit_log.checkpoints()]


@contextmanager
def _checkpoint_writes(kernel: Uprof) -> Iterator[list[str]]:
    """The statements that write the checkpoint table while the block runs."""
    engine = kernel.audit_log._engine
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "audit_checkpoints" in statement and not statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)


def test_polling_reuses_the_checkpoint_and_an_append_gives_a_new_one(kernel: Uprof) -> None:
    auditor = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    kernel.audit.record("consent.granted", subject_ref="subj_polled")
    first = auditor.audit_key()["checkpoint"]
    size = kernel.audit_log.size()
    assert _stored(kernel).count(size) == 1

    with _checkpoint_writes(kernel) as writes:
        polled = [auditor.audit_key()["checkpoint"] for _ in range(20)]
    assert writes == []  # no write tried, none refused
    assert set(polled) == {first}
    assert _stored(kernel).count(size) == 1 and len(_stored(kernel)) == 1
    key = kernel.audit_log.public_key
    assert verify_checkpoint(first, key, kernel.audit_log.origin) == (
        size,
        kernel.audit_log.root(),
    )

    # The log grows: the next poll covers the new size, stored once.
    kernel.audit.record("consent.granted", subject_ref="subj_polled2")
    after = auditor.audit_key()["checkpoint"]
    grown = kernel.audit_log.size()
    assert grown == size + 1
    assert verify_checkpoint(after, key, kernel.audit_log.origin).tree_size == grown
    for _ in range(5):
        assert auditor.audit_key()["checkpoint"] == after
    assert _stored(kernel) == [size, grown]
    assert kernel.audit_log.verify_integrity() == grown


def test_a_stored_checkpoint_for_the_size_is_reused_even_when_a_later_one_exists(
    kernel: Uprof,
) -> None:
    """The reuse is by the current size, not "the latest row": nothing goes back in time."""
    auditor = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    kernel.audit.record("consent.granted", subject_ref="subj_a")
    auditor.audit_key()
    kernel.audit.record("consent.granted", subject_ref="subj_b")
    note = auditor.audit_key()["checkpoint"]
    assert verify_checkpoint(note, kernel.audit_log.public_key, kernel.audit_log.origin)[0] == (
        kernel.audit_log.size()
    )


_POLLER = """
import json, sys, time
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from domain.principal import Principal
from uprof.facade import Facade

kernel = build_kernel(settings_for(Backend({kind!r}, {url!r}, Path({data!r}))), FakeClock())
try:
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    print("ready", flush=True)
    while not Path({go!r}).exists():  # both start together
        time.sleep(0.005)
    notes = []
    for i in range(40):
        if i % 10 == 0:
            kernel.audit.record("consent.granted", subject_ref=f"subj_{{sys.argv[1]}}{{i}}")
        notes.append(door.audit_key()["checkpoint"])
    print(json.dumps(notes))
finally:
    kernel.close()
"""


def test_two_processes_polling_at_once_store_one_checkpoint_per_size(
    kernel: Uprof, backend: Backend
) -> None:
    kernel.audit.record("consent.granted", subject_ref="subj_start")
    go = backend.data_dir / "go"
    script = _POLLER.format(
        kind=backend.kind, url=backend.url, data=str(backend.data_dir), go=str(go)
    )
    children = [PythonChild(script, name, stream_stdout=True) for name in ("p", "q")]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    go.touch()
    notes: list[str] = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        notes += json.loads(out.strip().splitlines()[-1])
    stored = _stored(kernel)
    assert len(stored) == len(set(stored))  # never two rows for one size (the key)
    # Every note handed out is a stored checkpoint of its size (what a proof starts from).
    by_size = {c.tree_size: c for c in kernel.audit_log.checkpoints()}
    key, origin = kernel.audit_log.public_key, kernel.audit_log.origin
    for note in set(notes):
        size, root = verify_checkpoint(note, key, origin)
        assert by_size[size].root == root
    # At most one per size the log went through while polled: 8 appends, 2 pollers.
    assert len(stored) <= 9
    assert kernel.audit_log.verify_integrity() == kernel.audit_log.size()
