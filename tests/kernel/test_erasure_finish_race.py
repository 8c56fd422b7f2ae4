"""Two processes finishing the same erasure at once record each destroyed key once (both
backends, real processes).

Decision 0071 (amended) made a finish from the draft write the ``key.destroyed`` entries
the log lacks for the request. It read the log, then appended: two processes finishing
the same erasure at once (two retries reaching two servers, or a retry while the first
request is still running) both read "none yet" and both appended, so the trail named one
key's destruction twice. Each child below stops at its first ``key.destroyed`` append
until the other has reached its own, which is that interleaving, made certain.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from audit.receipts import verify_receipt
from tests.children import PythonChild
from tests.conftest import Backend
from tests.kernel.other_process import crash_at, receipt_from_another_process
from tests.kernel.test_erasure import fill_with_canaries
from tests.kernel.test_erasure_resume import exported_trail_verifies, unfinished_request
from uprof.kernel import Uprof

CHILD_TIMEOUT_S = 120


def eraser(
    backend: Backend,
    meeting: Path,
    name: str,
    *,
    hold_destroy: Path | None = None,
    call: str = 'erase_subject("alice")',
) -> PythonChild:
    """A process running ``kernel.<call>`` (default: erasing "alice") and printing its
    receipt, stopping at its first ``key.destroyed`` append until two processes have
    reached theirs (files in ``meeting``; the wait gives up after 60 s so that a broken
    test ends). With ``hold_destroy`` (a folder), it stops instead right before it
    destroys the keys: it writes ``ready`` there and waits for ``go``."""
    script = textwrap.dedent(
        f"""
        import json, time
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, settings_for

        meeting = Path({str(meeting)!r})
        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = build_kernel(settings_for(backend), FakeClock())
        log = kernel.audit_log
        append_many = log.append_many
        met = []

        def meet_then_append(entries, *args, **kwargs):
            entries = list(entries)
            if not met and any(e.get("action") == "key.destroyed" for e in entries):
                met.append(True)
                (meeting / {name!r}).touch()
                deadline = time.monotonic() + 60
                while len(list(meeting.iterdir())) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
            return append_many(entries, *args, **kwargs)

        hold = {str(hold_destroy) if hold_destroy else None!r}
        if hold is None:
            log.append_many = meet_then_append
        else:
            destroy = kernel.keystore.destroy

            def destroy_when_told(*args, **kwargs):
                (Path(hold) / "ready").touch()
                deadline = time.monotonic() + 60
                while not (Path(hold) / "go").exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                return destroy(*args, **kwargs)

            kernel.keystore.destroy = destroy_when_told
        try:
            print(json.dumps(kernel.{call}.receipt))
        finally:
            kernel.close()
        """
    )
    return PythonChild(script)


def receipt_of(child: PythonChild) -> dict[str, Any]:
    out, err = child.communicate(CHILD_TIMEOUT_S)
    assert child.returncode == 0, err[-3000:]
    receipt: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return receipt


def finished(child: PythonChild) -> str:
    request_id: str = receipt_of(child)["body"]["request"]["request_id"]
    return request_id


def cited_keys(receipt: dict[str, Any]) -> list[tuple[int, str]]:
    return sorted(
        (a["key_version"], a["dek_commitment"])
        for a in receipt["body"]["actions"]
        if a["type"] == "dek_destroyed"
    )


def wait_for(child: PythonChild, path: Path) -> None:
    while not path.exists():
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(0.02)
        assert child.poll() is None, child.communicate()[1][-3000:]


def purges(kernel: Uprof, request_id: str) -> int:
    """The request's ``projection.purged`` entries (the purge happened once)."""
    return sum(
        1
        for e in kernel.audit_log.entries(action="projection.purged")
        if e.entry.get("request_id") == request_id
    )


def destructions(kernel: Uprof, request_id: str) -> Counter[str]:
    return Counter(
        e.entry["dek_commitment"]
        for e in kernel.audit_log.entries(action="key.destroyed")
        if e.entry.get("request_id") == request_id
    )


def test_two_processes_finishing_one_erasure_record_each_key_once(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """Killed before the keys went; two retries reach two processes at once."""
    fill_with_canaries(kernel, "alice")
    died = crash_at(backend, "destroy", 'erase_subject("alice")')
    assert died.returncode == 9, died.stderr[-3000:]
    request_id = unfinished_request(kernel, "alice")
    meeting = tmp_path / "meeting"
    meeting.mkdir()

    first, second = eraser(backend, meeting, "first"), eraser(backend, meeting, "second")

    assert finished(first) == finished(second) == request_id
    counts = destructions(kernel, request_id)
    assert counts and set(counts.values()) == {1}, counts
    assert purges(kernel, request_id) == 1
    assert exported_trail_verifies(kernel)


def test_a_retry_beside_the_running_erasure_records_each_key_once(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """The first request has destroyed the keys and is about to record it; a retry in
    another process finishes the same erasure from its ledger record meanwhile."""
    fill_with_canaries(kernel, "alice")
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    first = eraser(backend, meeting, "first")
    # The first process is at its key.destroyed append: the keys are gone, the entries
    # not yet written.
    wait_for(first, meeting / "first")
    second = eraser(backend, meeting, "second")

    request_id = finished(first)
    assert finished(second) == request_id
    counts = destructions(kernel, request_id)
    assert counts and set(counts.values()) == {1}, counts
    assert purges(kernel, request_id) == 1
    assert exported_trail_verifies(kernel)


def test_a_retry_that_destroys_the_keys_first_leaves_both_receipts_citing_them(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """The first request has recorded the erasure and not yet destroyed the keys; a
    retry in another process finishes it meanwhile (keys destroyed, receipt signed).
    The first request's own destruction then finds nothing left: its receipt must still
    cite the keys the erasure destroyed, as the retry's does."""
    fill_with_canaries(kernel, "alice")
    hold = tmp_path / "hold"
    hold.mkdir()
    first = eraser(backend, tmp_path, "first", hold_destroy=hold)
    wait_for(first, hold / "ready")

    retried = receipt_from_another_process(backend, 'erase_subject("alice")')
    (hold / "go").touch()
    receipt = receipt_of(first)

    assert receipt["body"]["request"]["request_id"] == retried["body"]["request"]["request_id"]
    assert cited_keys(retried)
    assert cited_keys(receipt) == cited_keys(retried)
    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    counts = destructions(kernel, receipt["body"]["request"]["request_id"])
    assert counts and set(counts.values()) == {1}, counts
