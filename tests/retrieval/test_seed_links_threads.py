"""Review of decision 0185: the bridges' einsum product, split over the helper thread.

``_seed_links`` cuts a large product in two: the process's one helper thread computes
the second half unless the caller, done with the first, takes it back (``cancel``). A
server ranks slices on many threads at once, all sharing that helper; these tests run
real threads against it, and check the tie promise beyond the sizes and widths the
earlier sweeps used.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from uprof.retrieval import ranker
from uprof.retrieval.ranker import _seed_links

SPLIT = ranker._SPLIT_LINKS_FROM


def _unit_rows(n: int, width: int, rng: np.random.Generator) -> np.ndarray:
    vectors = rng.standard_normal((n, width)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def test_many_threads_sharing_the_helper_each_get_their_own_whole_product() -> None:
    """Held: eight threads, each 12 products of its own size around and above the split
    point, at once: every result is its own einsum product bit for bit (no half written
    into another call's array, none left unwritten, none computed twice into garbage)."""
    sizes = [SPLIT - 1, SPLIT, SPLIT + 1, SPLIT * 2 + 7, SPLIT * 3 + 1]
    wrong: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def run(worker: int) -> None:
        rng = np.random.default_rng(worker)
        try:
            start.wait()
            for round_ in range(12):
                n = sizes[(worker + round_) % len(sizes)]
                vectors = _unit_rows(n, 384, rng)
                seeds = vectors[rng.choice(n, 10, replace=False)]
                got = _seed_links(seeds, vectors)
                if not np.array_equal(got, np.einsum("kj,ij->ki", seeds, vectors)):
                    wrong.append((worker, n))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors and not any(t.is_alive() for t in threads)
    assert wrong == []


@pytest.mark.parametrize("width", [8, 97, 100, 385, 768])
def test_copies_of_one_turn_tie_at_any_vector_width(width: int) -> None:
    """Held: the sweeps used 384 and 48 floats a row, both whole multiples of 64 bytes,
    so every row began on the same alignment. At other widths (the hashing embedder's
    dimension is a setting; other models give 768) rows begin on every alignment; copies
    of one turn, on either side of the split, must still get one cosine."""
    rng = np.random.default_rng(width)
    for n in (5, 63, 1_001, SPLIT * 2 + 7):
        vectors = _unit_rows(n, width, rng)
        half = n // 2
        spots = sorted({0, 1, 2, 3, half - 1, half, half + 1, n - 2, n - 1})
        vectors[spots] = vectors[spots[1]]
        for k in (1, 2, 10):
            links = _seed_links(vectors[rng.choice(n, min(k, n), replace=False)], vectors)
            for row in links:
                assert len(set(row[spots].tolist())) == 1, (n, k)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_keeps_no_queued_halves() -> None:
    """OT: a process that ranked a large index and then forks (a pre-forking server, an
    embedding app's worker pool) hands its child a helper whose thread does not exist
    there. The child's products stay right (the caller takes each half back), but each
    call must not leave its cancelled half, which holds the call's arrays, queued for
    the life of the child, and the child's halves must run on a helper of its own."""
    rng = np.random.default_rng(7)
    vectors = _unit_rows(SPLIT * 2 + 7, 384, rng)
    seeds = vectors[:10]
    _seed_links(seeds, vectors)  # the parent's helper thread now exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        code = 1
        try:
            ok = all(
                np.array_equal(_seed_links(seeds, vectors), np.einsum("kj,ij->ki", seeds, vectors))
                for _ in range(5)
            )
            helper = ranker._links_helper
            alive = any(t.is_alive() for t in helper._threads)
            if alive:  # FIFO: once this runs, every earlier half has left the queue
                helper.submit(int).result(120)
            os.write(write, f"{ok} {alive} {helper._work_queue.qsize()}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        reported = answer.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, reported
    assert reported == "True True 0"
