"""``uprof quarantine list|retry`` and ``uprof projections lag`` with a poison capture
(both backends): the deployment's own rules extractor, poisoned in this process."""

from __future__ import annotations

import json

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.poison import MARK, patch_rules
from tests.kernel.test_damaged_event_quarantined import damage
from tests.policies.test_policy_cli import cli_for
from uprof import retry
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap


def test_an_operator_lists_and_retries_quarantined_captures_from_the_cli(backend: Backend) -> None:
    k = bootstrap(settings_for(backend), clock=FakeClock(), embedder=HashingEmbedder())
    try:
        k.grant_consent("mallory", app_id=APP, categories=["*"], purposes=["personalization"])
        poison = k.capture("mallory", say(f"I am vegetarian {MARK}")).capture_id
        k.capture("mallory", say("I live in Oslo"))
    finally:
        k.close()
    run = cli_for(backend)
    undo = patch_rules(str(backend.data_dir / "attempts.log"))
    try:
        run("projections", "run")
        lag = json.loads(run("projections", "lag"))
        assert lag["quarantined"] == 1 and lag["caught_up"] is True, lag
        [held] = json.loads(run("quarantine", "list"))
        assert held["capture_id"] == poison and held["error"] == "PoisonError"
        assert held["attempts"] == retry.EXTRACTOR_CALL.attempts
        assert MARK not in json.dumps(held)
        assert json.loads(run("quarantine", "retry", poison)) == [
            {"capture_id": poison, "outcome": "still-failing", "error": "PoisonError"}
        ]
        run("quarantine", "retry", code=2)  # neither ids nor --all
    finally:
        undo()
    assert json.loads(run("quarantine", "retry", "--all")) == [
        {"capture_id": poison, "outcome": "released", "error": ""}
    ]
    assert json.loads(run("quarantine", "list")) == []
    assert json.loads(run("projections", "lag"))["quarantined"] == 0


def test_an_operator_sees_a_damaged_event_set_aside_from_the_cli(
    backend: Backend, clock: FakeClock
) -> None:
    """A damaged event set aside by its log position is listed, counted and retried with
    the other quarantined captures (decision 0124-damaged-events-quarantined)."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        k.process()
        k.capture("alice", say("I live in Oslo"))
        nid = damage(k, k.stream_of("alice"))
    run = cli_for(backend)
    run("projections", "run")
    lag = json.loads(run("projections", "lag"))
    assert lag["quarantined"] == 1 and lag["caught_up"] is True, lag
    [held] = json.loads(run("quarantine", "list"))
    assert held["capture_id"] == f"event:{nid}" and held["notification_id"] == nid
    assert (held["stage"], held["error"]) == ("damaged", "DamagedEventError")
    assert json.loads(run("quarantine", "retry", "--all")) == [
        {"capture_id": f"event:{nid}", "outcome": "still-failing", "error": "DamagedEventError"}
    ]
