"""The residue audit while an erasure is under way, or after one was killed (bugs PS, PT).

Decision 0198-residue-in-progress. Each erasure runs in a real child process
(``Held``, a kernel of its own on the test's stores) stopped at a step of the cascade;
the audit runs in this process, whose kernel was built before the child's ledger record
(a start re-applies the ledger: it would destroy what the test looks at). Both backends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.children import CLI_SCRIPT, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import cli_env, consented_settings, running, say
from tests.kernel.test_simultaneous_erasure_receipts import Held
from uprof.kernel import Uprof
from uprof.services.residue import IN_PROGRESS, INTERRUPTED, Finding
from uprof.settings import Settings

WORD = "Qzxmidwaycanary"


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return consented_settings(backend)


@pytest.fixture
def live(settings: Settings) -> Iterator[Uprof]:
    """A process of the deployment (a server) holding alice's words, projected."""
    with running(settings, FakeClock()) as k:
        k.capture("alice", say(f"I walk to {WORD} every day", ref="w1"))
        k.process()
        yield k


def _of(findings: list[Finding], stream: str) -> list[Finding]:
    return [f for f in findings if stream in f.location]


def test_a_scan_beside_a_running_erasure_says_in_progress(settings: Settings, live: Uprof) -> None:
    """PS: the child's erasure has destroyed alice's keys and stopped before its views
    pass the tombstone; the audit names what remains of her stream as an erasure in
    progress (its process holds its mark), one ``erasure`` finding for the request, and
    a scan after the child finished is clean."""
    stream = str(live.stream_of("alice"))
    held = Held(settings, "after-destroy").begin()
    try:
        report = live.residue_scan([WORD])
    finally:
        kind, answer = held.answer()
    assert kind == "ok", answer
    found = _of(report.findings, stream)
    assert not report.clean
    assert [f.kind for f in found if f.kind == "erasure"] == ["erasure"], report.findings
    assert {f.erasure for f in found} == {IN_PROGRESS}, report.findings
    assert [f for f in found if f.kind == "row"], "the views held her rows at the stop"
    after = live.residue_scan([WORD])
    assert after.clean, after.findings


def test_an_erasure_that_ends_during_the_scan_labels_what_it_saw_in_progress(
    settings: Settings, live: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PS: the scan reads alice's remaining rows while the child's erasure is stopped,
    and the erasure completes (receipt) before the scan labels its findings: they were
    true when read and are labelled in progress; the request, completed, is no finding."""
    import uprof.kernel

    stream = str(live.stream_of("alice"))
    held = Held(settings, "after-destroy").begin()
    label = uprof.kernel.label_erasures
    answers: list[tuple[str, object]] = []

    def after_the_erasure_ends(*args: object) -> None:
        answers.append(held.answer())
        label(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(uprof.kernel, "label_erasures", after_the_erasure_ends)
    try:
        report = live.residue_scan([WORD])
    finally:
        if not answers:
            held.answer()
    assert [kind for kind, _ in answers] == ["ok"], answers
    found = _of(report.findings, stream)
    assert [f for f in found if f.kind == "row"], report.findings
    assert {f.erasure for f in found} == {IN_PROGRESS}, report.findings
    assert not [f for f in found if f.kind == "erasure"], report.findings


def test_a_scan_after_an_erasure_killed_mid_way_says_interrupted_until_finished(
    settings: Settings, live: Uprof, backend: Backend
) -> None:
    """PS: the child is killed (-9) after destroying alice's keys, before its views pass
    the tombstone. The audit of a process that has not started since names her rows and
    the request as an interrupted erasure, with how to finish it; so does ``uprof audit
    residue`` in a new process (its start deleted her rows again, but issued no receipt:
    the request is still open). Asking for the erasure again finishes that request, with
    its receipt, and the audit is clean."""
    stream = str(live.stream_of("alice"))
    held = Held(settings, "after-destroy").begin()
    held.kill()
    report = live.residue_scan([WORD])
    found = _of(report.findings, stream)
    assert {f.erasure for f in found} == {INTERRUPTED}, report.findings
    (request,) = [f for f in found if f.kind == "erasure"]
    assert "ask for the same erasure again" in request.detail
    assert [f for f in found if f.kind == "row"], "the views held her rows at the kill"
    cli = run_python(CLI_SCRIPT, "audit", "residue", "--term", WORD, env=cli_env(backend))
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert f"erasure [{INTERRUPTED}] at erasure request" in cli.stdout, cli.stdout
    result = live.erase_subject("alice")  # asked again: the same request finishes
    assert result.receipt["body"]["request"]["request_id"] in request.location
    after = live.residue_scan([WORD])
    assert after.clean, after.findings


def test_an_erasure_killed_before_its_keys_went_is_not_clean(
    settings: Settings, live: Uprof
) -> None:
    """PT: killed after its ledger record, before the keys' destruction. The key store
    does not list the stream as shredded, and the audit checked only those: a process
    that has not started since said clean while alice's keys were in place (on main).
    Now the ledger's streams are checked too: her keys remain, labelled interrupted."""
    stream = str(live.stream_of("alice"))
    held = Held(settings, "before-destroy").begin()
    held.kill()
    report = live.residue_scan([WORD])
    found = _of(report.findings, stream)
    assert [f for f in found if f.kind == "key"], report.findings
    assert {f.erasure for f in found} == {INTERRUPTED}, report.findings
    live.erase_subject("alice")
    after = live.residue_scan([WORD])
    assert after.clean, after.findings
