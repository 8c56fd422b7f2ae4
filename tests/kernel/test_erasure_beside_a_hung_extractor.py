"""Erasure attacks, round 3: a worker process whose extraction never returns (an
extractor hung on another subject's capture, in the same batch as the erased subject's
newest capture, decrypted in its memory). An erasure from another process (the CLI's
way: it extracts and projects itself) must still complete with a receipt that verifies,
leave no residue, and once the hung worker is SIGKILLed and another process runs the
pipeline, nothing is extracted twice and the other subject is intact.

Held on both backends when written (main at 872c7b4). What it does not cover: a server
whose only worker is the hung one waits for its own worker (``erasure_incomplete``
until another process projects; docs/reliability.md, "Poison captures", Left).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from audit.receipts import verify_receipt
from domain.errors import SubjectErasedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, say, settings_for
from tests.kernel.test_keys_apart import ALICE, BOB, fill

ROOT = Path(__file__).resolve().parents[2]
LATE = "Qzxalicelatewords"


def _hung_worker(backend: Backend) -> subprocess.Popen[str]:
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock, FakeExtractor
        from tests.kernel.conftest import settings_for
        from uprof.adapters.embeddings import HashingEmbedder
        from uprof.bootstrap import bootstrap

        class Hanging(FakeExtractor):
            def extract(self, capture):
                if "HANGME" in capture.interaction.user_input:
                    print("HUNG", flush=True)
                    time.sleep(3600)
                return super().extract(capture)

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = bootstrap(
            settings_for(backend), clock=FakeClock(), embedder=HashingEmbedder(),
            extractor=Hanging(),
        )
        kernel.process()
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )


def test_an_erasure_completes_beside_a_worker_hung_in_extraction(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        k.capture_many("bob", [say("HANGME please")])
        k.capture_many("alice", [say(f"late {LATE} words")])
    worker = _hung_worker(backend)
    try:
        assert worker.stdout is not None
        ready, _, _ = select.select([worker.stdout], [], [], 300)
        assert ready and worker.stdout.readline().strip() == "HUNG"
        terms = [*ALICE.values(), LATE]
        with running(settings, clock) as k:
            done = k.erase_subject("alice")
            verify_receipt(done.receipt, k.audit_log.public_key, origin=k.audit_log.origin)
            report = k.residue_scan(terms)
            assert report.clean, report.findings
            with pytest.raises(SubjectErasedError):
                k.profile("alice")
        assert worker.poll() is None  # still hung: the erasure did not need it
        worker.kill()
        worker.wait(timeout=60)
        with running(settings, clock) as k:  # the next worker
            k.process()
            texts = [m.text for m in k.profile("bob").memories]
            assert texts.count("HANGME please") == 1, texts
            assert f"I live in {BOB['attribute']}" in texts
            assert k.residue_scan(terms).clean
            assert k.audit_log.verify_integrity() == k.audit_log.size()
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
