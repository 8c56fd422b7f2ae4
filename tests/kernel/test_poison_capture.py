"""A poison capture (its extraction raises on every attempt) is quarantined, not retried
for ever, and the pipeline goes on with the rest in order (both backends).

Found 2026-12-05 (attack on the workers): an extractor that raises for one capture made
every batch holding it fail. ``process()`` raised before projecting anything, so one
capture stopped extraction *and* projection for every subject of its partition (of the
whole deployment with one partition, the default); a server's worker and ``uprof worker``
retried the same batch for as long as they ran (back-off up to 30 s, a traceback per try),
and readiness said only "pipeline worker failing" with the error's message, which may
quote the capture. Now the extractor gets ``retry.EXTRACTOR_CALL``'s attempts per capture,
then the capture is quarantined: a ``CaptureQuarantined`` event (sealed under the
capture's own key, so erasing the capture or the subject shreds it) saved with the
batch's position, and a ``capture.quarantined`` audit entry (ids and the error's class
only). Operators list and retry quarantined captures through the door.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from domain.errors import PermissionDeniedError
from domain.principal import Principal, PrincipalKind
from domain.profile import SubjectProfile
from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock, FakeExtractor
from tests.kernel.conftest import APP, other_tenant, say, settings_for
from tests.kernel.other_process import run_in_another_process
from tests.kernel.poison import MARK, PoisonExtractor, patch_rules
from uprof import retry
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.facade import Facade
from uprof.kernel import Uprof

POISON_TEXT = f"I live in {MARK}ville and my passport is X1234567"


@pytest.fixture
def poisoned(backend: Backend) -> Iterator[tuple[Uprof, PoisonExtractor]]:
    extractor = PoisonExtractor(FakeExtractor())
    k = bootstrap(
        settings_for(backend), clock=FakeClock(), embedder=HashingEmbedder(), extractor=extractor
    )
    try:
        for subject in ("mallory", "bob"):
            k.grant_consent(subject, app_id=APP, categories=["*"], purposes=["personalization"])
        yield k, extractor
    finally:
        k.close()


def operator(k: Uprof) -> Facade:
    return Facade(k, Principal.local_operator(k.subjects.tenant))


def homes(k: Uprof, subject: str) -> list[str]:
    return sorted(a.value for a in k.profile(subject).attributes if a.key == "home_location")


def log_events(k: Uprof, cls: type) -> list[object]:
    found = []
    position = 0
    while page := k.app.notifications_after(position, 500):
        found += [e for n in page if isinstance(e := k.app.decode(n), cls)]
        position = page[-1].id
    return found


def test_a_poison_capture_is_quarantined_and_the_pipeline_goes_on(
    poisoned: tuple[Uprof, PoisonExtractor],
) -> None:
    k, extractor = poisoned
    k.capture("bob", say("I live in Oslo"))
    poison = k.capture("mallory", say(POISON_TEXT)).capture_id
    k.capture("bob", say("I live in Bergen"))
    k.capture("mallory", say("I live in Rome"))

    k.process()  # raised on the old code, every time, before projecting anything

    lag = k.lag()
    assert lag.extraction_pending == 0 and lag.projection_pending == 0
    assert lag.quarantined == 1
    assert homes(k, "bob") == ["Bergen", "Oslo"]  # the captures after it, in order
    assert homes(k, "mallory") == ["Rome"]
    # Bounded: the retry policy's attempts, and none at later runs.
    assert extractor.attempts[poison] == retry.EXTRACTOR_CALL.attempts
    k.process()
    k.process()
    assert extractor.attempts[poison] == retry.EXTRACTOR_CALL.attempts

    [held] = operator(k).list_quarantined()
    assert held.capture_id == poison
    assert held.stage == "extract" and held.error == "PoisonError"
    assert held.attempts == retry.EXTRACTOR_CALL.attempts
    assert held.subject == k.subjects.pseudonym("mallory")
    [event] = log_events(k, SubjectProfile.CaptureQuarantined)
    assert event.capture_id == poison  # type: ignore[attr-defined]

    entries = [e.entry for e in k.audit_entries(action="capture.quarantined")]
    assert len(entries) == 1
    assert entries[0]["event_ids"] == [poison]
    assert entries[0]["reason_code"] == "PoisonError"
    text = json.dumps([e.entry for e in k.audit_entries()])
    assert MARK not in text and "X1234567" not in text


def test_an_operator_retries_a_quarantined_capture_through_the_door(
    poisoned: tuple[Uprof, PoisonExtractor],
) -> None:
    k, extractor = poisoned
    poison = k.capture("mallory", say(POISON_TEXT)).capture_id
    k.process()
    door = operator(k)

    # Still failing: it stays quarantined, and says so.
    [outcome] = door.retry_quarantined([poison])
    assert outcome.capture_id == poison and outcome.outcome == "still-failing"
    assert outcome.error == "PoisonError"
    assert [q.capture_id for q in door.list_quarantined()] == [poison]

    extractor.poisoned = False  # the extractor was fixed
    [outcome] = door.retry_quarantined(None)  # every quarantined capture
    assert outcome.outcome == "released"
    assert door.list_quarantined() == []
    assert k.lag().quarantined == 0
    assert homes(k, "mallory") == [f"{MARK}ville"]
    # A second retry finds nothing to do (once, however often it is asked).
    [again] = door.retry_quarantined([poison])
    assert again.outcome == "not-quarantined"
    assert homes(k, "mallory") == [f"{MARK}ville"]
    actions = [e.entry["action"] for e in k.audit_entries()]
    assert actions.count("capture.released") == 1
    assert "quarantine.listed" in actions

    # Apps are not operators: the door refuses them (and audits the refusal).
    app_door = Facade(k, Principal(k.subjects.tenant, APP, "k1", PrincipalKind.APP))
    with pytest.raises(PermissionDeniedError):
        app_door.list_quarantined()
    with pytest.raises(PermissionDeniedError):
        app_door.retry_quarantined([poison])


def test_erasing_the_subject_or_the_capture_removes_it_from_quarantine(
    poisoned: tuple[Uprof, PoisonExtractor],
) -> None:
    k, _ = poisoned
    k.grant_consent("eve", app_id=APP, categories=["*"], purposes=["personalization"])
    mallorys = k.capture("mallory", say(POISON_TEXT)).capture_id
    eves = k.capture("eve", say(POISON_TEXT + " too")).capture_id
    k.process()
    assert {q.capture_id for q in operator(k).list_quarantined()} == {mallorys, eves}

    k.erase_subject("mallory")
    k.erase_capture("eve", eves)
    k.process()

    assert operator(k).list_quarantined() == []
    assert k.lag().quarantined == 0
    report = k.residue_scan([f"{MARK}ville", "X1234567"])
    assert report.clean, report.findings


def test_quarantine_survives_a_restart_and_other_processes_see_it(
    poisoned: tuple[Uprof, PoisonExtractor], backend: Backend
) -> None:
    k, _ = poisoned
    poison = k.capture("mallory", say(POISON_TEXT)).capture_id
    k.process()
    done = run_in_another_process(
        backend,
        """
        print(json.dumps([q.capture_id for q in kernel.quarantined()]))
        print(kernel.lag().quarantined)
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    listed, count = done.stdout.strip().splitlines()[-2:]
    assert json.loads(listed) == [poison] and count == "1"


def test_a_worker_killed_mid_retry_leaves_the_position_and_quarantines_once_later(
    backend: Backend, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    k = bootstrap(settings, clock=FakeClock(), embedder=HashingEmbedder())
    try:
        for subject in ("mallory", "bob"):
            k.grant_consent(subject, app_id=APP, categories=["*"], purposes=["personalization"])
        k.capture("bob", say("I am vegetarian"))
        poison = k.capture("mallory", say("I am vegetarian " + MARK)).capture_id
        k.capture("bob", say("I live in Oslo"))
    finally:
        k.close()
    log = tmp_path / "attempts.log"
    # The deployment's own rules extractor, killed (exit 9) at its second attempt.
    done = run_in_another_process(
        backend,
        f"""
        os.environ["UPROF_POISON_EXIT_AT"] = "2"
        from tests.kernel.poison import patch_rules
        patch_rules({str(log)!r})
        from uprof.bootstrap import bootstrap
        from uprof.adapters.embeddings import HashingEmbedder
        kernel.close()
        kernel = bootstrap(settings_for(backend), clock=FakeClock(), embedder=HashingEmbedder())
        kernel.process()
        """,
    )
    assert done.returncode == 9, done.stderr[-3000:]
    assert len(log.read_text().splitlines()) == 2
    k = bootstrap(settings, clock=FakeClock(), embedder=HashingEmbedder())
    try:
        # Nothing of the killed batch stayed: not extracted, not quarantined.
        assert k.lag().extraction_pending == 3
        assert log_events(k, SubjectProfile.CaptureQuarantined) == []
        undo = patch_rules(str(log))
        try:
            k.process()
        finally:
            undo()
        assert [q.capture_id for q in k.quarantined()] == [poison]
        assert len(log_events(k, SubjectProfile.CaptureQuarantined)) == 1
        assert k.lag().caught_up
        diets = [a.value for a in k.profile("bob").attributes if a.key == "diet"]
        assert diets == ["vegetarian"]
        live = k.queries.table_digest()
        k.rebuild()
        assert k.queries.table_digest() == live
    finally:
        k.close()


class PoisonEmbedder(HashingEmbedder):
    """A model that raises for any text holding the mark, on every attempt."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if any(MARK in t for t in texts):
            raise ValueError(f"cannot embed {[t for t in texts if MARK in t]!r}")
        return super().embed(texts)


def test_a_memory_the_model_cannot_embed_is_projected_without_its_vector(
    backend: Backend,
) -> None:
    k = bootstrap(
        settings_for(backend),
        clock=FakeClock(),
        embedder=PoisonEmbedder(),
        extractor=FakeExtractor(),
    )
    try:
        for subject in ("mallory", "bob"):
            k.grant_consent(subject, app_id=APP, categories=["*"], purposes=["personalization"])
        k.capture("bob", say("I live in Oslo"))
        k.capture("mallory", say(f"I drink {MARK}berry tea every morning"))
        k.capture("bob", say("I like green tea"))

        k.process()  # raised on the old code, every time: no event projected after it

        assert k.lag().caught_up
        stream = str(k.stream_of("bob"))
        rows, vectors = k.queries.memories(stream, with_vectors=True)
        assert len(rows) == 2 and vectors is not None  # bob's memories have their vectors
        rows, vectors = k.queries.memories(str(k.stream_of("mallory")), with_vectors=True)
        assert len(rows) == 1 and vectors is None  # found by its words only
        live = k.queries.table_digest()
        k.rebuild()
        assert k.queries.table_digest() == live
        served = k.slice(
            "mallory",
            "what tea do I drink",
            budget_tokens=500,
            purpose="personalization",
            app_id=APP,
            agent_id="agent:one",
        )
        assert any(f"{MARK}berry" in item.text for item in served.items), served
    finally:
        k.close()


def retrier(backend: Backend, meeting: Path, name: str, other: str) -> PythonChild:
    """A process that retries every quarantined capture (its extractor works), meeting
    the other at its first save: both have extracted and decided before either saves."""
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
        save = kernel.app.save
        met = []

        def meet(*aggregates):
            if not met:
                met.append(True)
                (meeting / {name!r}).touch()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not (meeting / {other!r}).exists():
                    time.sleep(0.01)
            return save(*aggregates)

        kernel.app.save = meet
        try:
            print(json.dumps([o.outcome for o in kernel.retry_quarantined(None)]))
        finally:
            kernel.close()
        """
    )
    return PythonChild(script)


def test_two_processes_retrying_at_once_release_a_capture_once(
    poisoned: tuple[Uprof, PoisonExtractor], backend: Backend, tmp_path: Path
) -> None:
    k, _ = poisoned
    poison = k.capture("mallory", say(POISON_TEXT)).capture_id
    k.process()
    children = [retrier(backend, tmp_path, "a", "b"), retrier(backend, tmp_path, "b", "a")]
    outcomes = []
    for child in children:
        out, err = child.communicate(120)
        assert child.returncode == 0, err[-3000:]
        outcomes += json.loads(out.strip().splitlines()[-1])
    assert sorted(outcomes) == ["not-quarantined", "released"]
    assert len(log_events(k, SubjectProfile.CaptureReleased)) == 1
    memories = [
        e
        for e in log_events(k, SubjectProfile.MemoryRecorded)
        if poison in e.evidence  # type: ignore[attr-defined]
    ]
    assert len(memories) == 1
    assert [e.entry["outcome"] for e in k.audit_entries(action="capture.released")] == ["released"]
    k.process()
    assert k.lag().quarantined == 0 and homes(k, "mallory") == [f"{MARK}ville"]


def test_another_tenant_on_the_same_stores_neither_lists_nor_retries_it(
    poisoned: tuple[Uprof, PoisonExtractor], backend: Backend
) -> None:
    k, _ = poisoned
    poison = k.capture("mallory", say(POISON_TEXT)).capture_id
    k.process()
    done = run_in_another_process(
        backend,
        f"""
        kernel.close()
        from tests.fakes.ports import FakeExtractor
        from uprof.adapters.embeddings import HashingEmbedder
        from uprof.bootstrap import bootstrap
        other = settings_for(backend).model_copy(update={{"tenant": "other"}})
        kernel = bootstrap(
            other, clock=FakeClock(), embedder=HashingEmbedder(), extractor=FakeExtractor()
        )
        print(json.dumps([q.capture_id for q in kernel.quarantined()]))
        print(json.dumps([o.outcome for o in kernel.retry_quarantined([{poison!r}])]))
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    listed, retried = done.stdout.strip().splitlines()[-2:]
    assert json.loads(listed) == [] and json.loads(retried) == ["not-quarantined"]
    assert [q.capture_id for q in k.quarantined()] == [poison]


def test_a_capture_whose_proposals_the_update_engine_refuses_is_quarantined_alone(
    poisoned: tuple[Uprof, PoisonExtractor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The update engine raising for one capture's proposals (a bug on some input): that
    capture is quarantined at once (stage ``apply``), and the subject's other captures of
    the batch, before and after it, are applied once each, to a freshly loaded profile."""
    k, _ = poisoned
    apply = SubjectProfile.apply_proposals

    def refusing(self: SubjectProfile, batch: Any, **kw: Any) -> int:
        result = apply(self, batch, **kw)  # events pending on the profile, then the raise
        if any("APPLY" in getattr(p, "text", "") for p in batch.proposals):
            raise ValueError("the update engine cannot take this")
        return result

    monkeypatch.setattr(SubjectProfile, "apply_proposals", refusing)
    first = k.capture("mallory", say("I live in Rome")).capture_id
    bad = k.capture("mallory", say("APPLY me")).capture_id
    last = k.capture("mallory", say("I like green tea")).capture_id
    k.capture("bob", say("I live in Oslo"))
    k.process()

    assert k.lag().caught_up
    [held] = k.quarantined()
    assert (held.capture_id, held.stage, held.error, held.attempts) == (
        bad,
        "apply",
        "ValueError",
        1,
    )
    cited = [
        c
        for e in log_events(k, SubjectProfile.MemoryRecorded)
        for c in e.evidence  # type: ignore[attr-defined]
    ]
    assert sorted(cited).count(first) == 1 and cited.count(last) == 1
    assert bad not in cited
    assert homes(k, "mallory") == ["Rome"] and homes(k, "bob") == ["Oslo"]


def test_a_verdict_whose_audit_entry_was_lost_gets_it_at_the_next_listing(
    poisoned: tuple[Uprof, PoisonExtractor],
) -> None:
    """As when the worker dies between its batch's commit and its audit append."""
    k, _ = poisoned
    recorded = k.extraction.on_quarantined
    k.extraction.on_quarantined = lambda _q: None  # the append never happens
    poison = k.capture("mallory", say(POISON_TEXT)).capture_id
    k.process()
    k.extraction.on_quarantined = recorded
    assert list(k.audit_entries(action="capture.quarantined")) == []

    door = operator(k)
    for _ in range(2):
        assert [q.capture_id for q in door.list_quarantined()] == [poison]
    [entry] = [e.entry for e in k.audit_entries(action="capture.quarantined")]
    assert entry["event_ids"] == [poison] and "principal" not in entry


def test_a_verdict_on_another_tenants_capture_is_recorded_under_that_tenant(
    poisoned: tuple[Uprof, PoisonExtractor], backend: Backend, tmp_path: Path
) -> None:
    """Tenants on one set of stores share the event log and a worker extracts every
    tenant's captures. The default tenant's worker quarantining the other tenant's
    capture wrote ``capture.quarantined`` under its own tenant with the other tenant's
    pseudonym: that tenant's auditors never saw it, the worker's saw another's subject.
    Found by the review of decisions 0097 and 0101 (2026-12-05)."""
    k, _ = poisoned
    other = other_tenant(settings_for(backend), tmp_path, "other")
    there = bootstrap(
        other, clock=FakeClock(), embedder=HashingEmbedder(), extractor=FakeExtractor()
    )
    try:
        there.grant_consent("alice", app_id=APP, categories=["*"], purposes=["personalization"])
        poison = there.capture("alice", say(POISON_TEXT)).capture_id
        pseudonym = there.subjects.pseudonym("alice")
    finally:
        there.close()
    k.process()  # the default tenant's worker, with the poisoned extractor
    [entry] = [e.entry for e in k.audit_log.entries(action="capture.quarantined")]
    assert entry["event_ids"] == [poison]
    assert (entry["tenant"], entry["subject_ref"]) == ("other", pseudonym)


def test_a_verdict_on_a_capture_whose_subject_is_erased_meanwhile_names_no_tenant(
    poisoned: tuple[Uprof, PoisonExtractor], backend: Backend, tmp_path: Path
) -> None:
    """Review of decisions 0104 and 0105 (2026-12-05). The entry takes its tenant from the
    subject index, read after the batch's save; a subject its own tenant's process erased
    in between is no longer there, and the entry was written under the worker's tenant:
    that tenant's auditors saw another tenant's capture id and its error class. A subject
    erased since gets no entry (its erasure is what the log says of its data, as for the
    late ``capture.accepted``, decision 0101). The erasure is a real process of the other
    tenant."""
    k, _ = poisoned
    other = other_tenant(settings_for(backend), tmp_path, "other")
    there = bootstrap(
        other, clock=FakeClock(), embedder=HashingEmbedder(), extractor=FakeExtractor()
    )
    try:
        there.grant_consent("alice", app_id=APP, categories=["*"], purposes=["personalization"])
        poison = there.capture("alice", say(POISON_TEXT)).capture_id
    finally:
        there.close()
    recorded = k.extraction.on_quarantined

    def erased_first(quarantined: Any) -> None:  # after the save, before the append
        child = PythonChild(
            textwrap.dedent(
                f"""
                from tests.fakes.ports import FakeClock
                from tests.kernel.conftest import build_kernel
                from uprof.settings import Settings

                settings = Settings.model_validate_json({other.model_dump_json()!r})
                kernel = build_kernel(settings, FakeClock())
                try:
                    kernel.erase_subject("alice")
                finally:
                    kernel.close()
                """
            )
        )
        _, err = child.communicate(180)
        assert child.returncode == 0, err[-3000:]
        recorded(quarantined)

    k.extraction.on_quarantined = erased_first  # type: ignore[method-assign]
    k.process()
    entries = [e.entry for e in k.audit_log.entries(action="capture.quarantined")]
    assert [e for e in entries if poison in e["event_ids"]] == []
