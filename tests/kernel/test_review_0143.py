"""Review of 0143: the start check of bug HT taken while other processes append and
checkpoint (held, real processes, both backends).

A start reads the key folder's checkpoint note before the log, and a checkpoint raises the
note only after its row, and every entry it covers, committed: a start racing any number
of appends and checkpoints in other processes always finds a log that extends the note
it read. Here one process appends and checkpoints in a loop while two others start (build
a kernel, which runs the check, and close it) again and again: no start is refused, and
the note ends at least as high as the last checkpoint the writer signed.
"""

from __future__ import annotations

import threading

from tests.conftest import Backend
from tests.kernel.other_process import run_in_another_process
from uprof.kernel import Uprof

ROUNDS = 30
STARTS = 6


def test_starts_racing_appends_and_checkpoints_are_never_refused(
    kernel: Uprof, backend: Backend
) -> None:
    kernel.audit_log.checkpoint()  # a note to check against from the first start on
    results: dict[str, object] = {}

    def writer() -> None:
        results["writer"] = run_in_another_process(
            backend,
            f"""
            for n in range({ROUNDS}):
                kernel.audit.record("subject.exported", subject_ref=f"subj_{{n}}")
                size = kernel.audit_log.checkpoint_record().tree_size
            print("last", size)
            """,
        )

    def starter(name: str) -> None:
        results[name] = run_in_another_process(
            backend,
            f"""
            from tests.fakes.ports import FakeClock
            from tests.kernel.conftest import build_kernel, settings_for
            for n in range({STARTS}):
                build_kernel(settings_for(backend), FakeClock()).close()
            print("started", {STARTS})
            """,
        )

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=starter, args=(f"starter{i}",)) for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, done in results.items():
        assert done.returncode == 0, (name, done.stderr[-3000:])  # type: ignore[attr-defined]
    last = int(results["writer"].stdout.split()[-1])  # type: ignore[attr-defined]
    assert last > ROUNDS
    kernel.audit_log.check_extends_anchor()
    note = kernel.audit_log._anchor.anchored_checkpoint()  # type: ignore[union-attr]
    assert note is not None and int(note.split("\n")[1]) >= last
