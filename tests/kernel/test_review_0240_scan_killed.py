"""Review of 0240-readers-beside-a-rebuild (decision 0244-review-of-0235-to-0242), held:
a residue scan killed -9 while it holds the views' schema lock (bug WZ put the scan
under it) leaves no lock behind. The next rebuild and the next scan, in another
process, proceed at once; neither waits out ``schema_lock_wait_s``. SQLite's lock is an
flock (the kernel lets go with the process), PostgreSQL's an advisory lock of the
scan's session (the server ends the session when its socket closes). Real processes;
no sleep decides anything."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, sail_intent_of_alice, settings_for

WAIT_S = 60.0
#: The bound the next scan and rebuild are given: a lock left behind fails the test
#: (SchemaLockWaitError) within it instead of hanging for the default 300 s.
LOCK_WAIT_S = 30.0

_SCAN_HELD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.conftest import Backend
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel, settings_for

    backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    held = Path(sys.argv[4])
    kernel = build_kernel(settings_for(backend), FakeClock())

    def scan_forever(terms):
        held.touch()  # inside the scan, the schema lock held
        while True:
            time.sleep(0.05)

    kernel._residue_scan = scan_forever
    kernel.residue_scan(["Paris"])
    """
)


def test_held_a_residue_scan_killed_holding_the_schema_lock_leaves_no_lock(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend).model_copy(update={"schema_lock_wait_s": LOCK_WAIT_S})
    kernel = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(kernel, "sail")
        kernel.erase_item("alice", intent.item_id)
        kernel.process()
        held = tmp_path / "held"
        child = PythonChild(_SCAN_HELD, backend.kind, backend.url, str(backend.data_dir), str(held))
        deadline = time.monotonic() + WAIT_S
        while not held.exists():
            assert child.poll() is None, child.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the scan never took its lock"
            time.sleep(0.02)
        child.kill()  # SIGKILL, inside the scan, the lock held
        child.wait()
        assert child.returncode == -9
        report = kernel.residue_scan(["Paris"])  # waits at most LOCK_WAIT_S, then raises
        assert report is not None
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
        assert intent.item_id not in [i.item_id for i in kernel.profile("alice").intents]
    finally:
        kernel.close()
