"""What a process keeps in memory of a subject that another process erased (both
backends, two real processes).

The erasing process flushes its own caches (``Uprof.flush_caches``); every other process
kept its decrypted copies: the slice service's view of the subject (memory texts,
attribute values, vectors), the capture writer's and the read recorder's saved
aggregates, the stemmed words and term sets of its texts. Nothing served them again (a
read finds the tombstone), but they stayed in memory for as long as nothing evicted them,
while the receipt said the caches were invalidated. Now every process drops them once it
sees the erasure in the erasure ledger: its pipeline worker looks every run (a server's
every ``IDLE_POLL_S`` when idle), and so does every read and write of the kernel.
"""

from __future__ import annotations

from uuid import UUID

from tests.conftest import Backend
from tests.kernel.conftest import APP, consent, say
from tests.kernel.other_process import receipt_from_another_process
from tests.kernel.test_erasure import CANARIES, fill_with_canaries
from uprof.kernel import Uprof
from uprof.retrieval import text as retrieval_text


def held_here(kernel: Uprof, stream: UUID) -> list[str]:
    """The caches of this process that hold something of the stream."""
    held = []
    if any(key == str(stream) for key, _ in kernel.slice_service._cache.items()):
        held.append("slice view")
    if any(key == stream for key, _ in kernel.capture_service.writer._saved.items()):
        held.append("capture writer")
    if any(key == stream for key, _ in kernel.reads._saved.items()):
        held.append("read recorder")
    if any(key == str(stream) for key, _ in kernel.keystore._deks.items()):
        held.append("data keys")
    if retrieval_text.term_set.cache_info().currsize:
        held.append("term sets")
    return held


def read(kernel: Uprof, subject: str) -> None:
    kernel.slice(
        subject,
        CANARIES["memory"],
        budget_tokens=400,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
    )


def test_a_subject_erased_by_another_process_leaves_nothing_in_this_ones_caches(
    backend: Backend, kernel: Uprof
) -> None:
    fill_with_canaries(kernel, "alice")
    stream = kernel.stream_of("alice")
    read(kernel, "alice")
    kernel.reads.drain()
    assert "slice view" in held_here(kernel, stream)  # the check can fail

    receipt_from_another_process(backend, 'erase_subject("alice")')

    kernel.process()  # what this process's pipeline worker runs, at least every 50 ms
    assert held_here(kernel, stream) == []


def test_a_read_of_another_subject_drops_what_another_process_erased(
    backend: Backend, kernel: Uprof
) -> None:
    fill_with_canaries(kernel, "alice")
    consent(kernel, "bob")
    kernel.capture("bob", say("I play chess"))
    kernel.process()
    stream = kernel.stream_of("alice")
    read(kernel, "alice")
    assert "slice view" in held_here(kernel, stream)

    receipt_from_another_process(backend, 'erase_subject("alice")')

    read(kernel, "bob")  # a server without a worker (uprof serve --no-worker) only reads
    assert "slice view" not in held_here(kernel, stream)
