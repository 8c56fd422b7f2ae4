"""A damaged event set aside by real processes racing on one partition (both backends).

Three processes extract the same partition at once: one verdict is recorded and every other
capture is extracted once. A process killed (exit 9, no cleanup) after deciding to set
the event aside and before its batch commits leaves no verdict and no moved position; the
next process sets it aside once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from domain.profile import SubjectProfile
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, say, settings_for
from tests.kernel.test_damaged_event_quarantined import damage, set_aside

REPO = Path(__file__).resolve().parents[2]
BOB_CAPTURES = 40


def _child(backend: Backend, body: str) -> subprocess.Popen[str]:
    script = (
        textwrap.dedent(
            f"""
        import os
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, settings_for

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = build_kernel(settings_for(backend), FakeClock())
        """
        )
        + textwrap.dedent(body)
        + "\nkernel.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _prepare(backend: Backend, clock: FakeClock) -> int:
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.process()
        k.capture_many("alice", [say("I met Qzxdamaged at the market", ref="a-1")])
        for i in range(BOB_CAPTURES):
            k.capture_many("bob", [say(f"I met Qzxfriend{i} at the market", ref=f"b-{i}")])
        return damage(k, k.stream_of("alice"))


def _extracted_once(k: object) -> None:
    app = k.app  # type: ignore[attr-defined]
    stream = k.stream_of("bob")  # type: ignore[attr-defined]
    cited: Counter[str] = Counter()
    for e in app.stream_events(stream):
        if isinstance(e, SubjectProfile.MemoryRecorded):  # type: ignore[misc]
            cited.update(e.evidence)
    assert len(cited) == BOB_CAPTURES
    assert set(cited.values()) == {1}


def test_three_processes_set_a_damaged_event_aside_once(backend: Backend, clock: FakeClock) -> None:
    nid = _prepare(backend, clock)
    # All three meet at a barrier (a file each) once their kernels are built, then extract.
    gate = backend.data_dir / "gate"
    gate.mkdir()
    body = f"""
        import time
        Path({str(gate)!r}, str(os.getpid())).touch()
        while len(list(Path({str(gate)!r}).iterdir())) < 3:
            time.sleep(0.005)
        kernel.extraction.run_until_idle()
        print("lost races", kernel.extraction.moved_conflicts)
        """
    children = [_child(backend, body) for _ in range(3)]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        print(out.strip().splitlines()[-1])
    with running(settings_for(backend), clock) as k:
        [verdict] = set_aside(k)
        assert verdict.notification_id == nid  # type: ignore[attr-defined]
        k.process()
        _extracted_once(k)
        assert len(set_aside(k)) == 1


def test_a_process_killed_before_its_verdict_commits_leaves_nothing(
    backend: Backend, clock: FakeClock
) -> None:
    nid = _prepare(backend, clock)
    with running(settings_for(backend), clock) as k:
        before = k.extraction.position
    # Dies inside the save that carries the verdict and the position (kill -9: no cleanup).
    killed = _child(
        backend,
        """
        from uprof.eventstore import ProfilesApplication
        plain = ProfilesApplication.save_tracked
        def dying(self, aggregates, tracking, *, events=()):
            if events:
                os._exit(9)
            return plain(self, aggregates, tracking, events=events)
        ProfilesApplication.save_tracked = dying
        kernel.extraction.run_until_idle()
        """,
    )
    killed.communicate(timeout=300)
    assert killed.returncode == 9
    with running(settings_for(backend), clock) as k:
        assert set_aside(k) == []
        assert k.extraction.position == before
        k.process()
        assert [v.notification_id for v in set_aside(k)] == [nid]  # type: ignore[attr-defined]
        _extracted_once(k)
        assert [q.notification_id for q in k.quarantined()] == [nid]


def test_three_projecting_processes_set_a_damaged_item_aside_once(
    backend: Backend, clock: FakeClock
) -> None:
    """An extracted memory damaged before it is projected: three real projecting
    processes meet it at once (bug DC). One verdict; bob's items projected."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.capture_many("alice", [say("I met Qzxdamaged at the market", ref="a-1")])
        for i in range(10):
            k.capture_many("bob", [say(f"I met Qzxfriend{i} at the market", ref=f"b-{i}")])
        k.extraction.run_until_idle()  # extracted, not projected
        nid = damage(k, k.stream_of("alice"), topic="MemoryRecorded")
    gate = backend.data_dir / "gate"
    gate.mkdir()
    body = f"""
        import time
        Path({str(gate)!r}, str(os.getpid())).touch()
        while len(list(Path({str(gate)!r}).iterdir())) < 3:
            time.sleep(0.005)
        kernel.projections.run_until_idle()
        """
    children = [_child(backend, body) for _ in range(3)]
    for child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
    with running(settings_for(backend), clock) as k:
        assert [v.notification_id for v in set_aside(k)] == [nid]  # type: ignore[attr-defined]
        assert len(k.profile("bob").memories) == 10
        [entry] = [e.entry for e in k.audit_entries(action="capture.quarantined")]
        assert entry["event_ids"] == [f"event:{nid}"]
