"""REST captures committed in groups (decisions 0017 and 0034-capture-throughput): the
route waits for the writer on the event loop, and a request refused inside a group
(by the policy, for want of consent, or naming no subject) is answered alone while the
rest of its group commits. Both backends, a live server, concurrent clients."""

from __future__ import annotations

import threading
from collections import Counter

import httpx

from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from uprof.api import ApiKeyStore
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof

ROUNDS = 6


def _captures_in_log(kernel: Uprof) -> Counter[str]:
    notes = kernel.app.notifications_after(0, 10_000, topics=[CAPTURED_TOPIC])
    return Counter(kernel.app.decode(n).capture_id for n in notes)


def test_requests_refused_inside_a_group_do_not_touch_the_others(
    server: LiveServer, http: httpx.Client, apps: Apps, keys: ApiKeyStore, kernel: Uprof
) -> None:
    for subject in ("alice", "bob"):
        grant(http, apps.planner, subject)
    rogue = keys.create("app:rogue").token  # no role in the policy: may not capture
    writer = kernel.capture_service.writer
    assert writer.running
    groups_before, grouped_before = writer.groups, writer.grouped_requests
    denied_before = len(list(kernel.audit_log.entries(action="access.denied")))
    # Who sends what, all at once: allowed captures for two subjects, captures by an
    # app the policy refuses, by an app without consent, and about nobody at all.
    plan = {
        "planner-alice": (apps.planner, "alice", "personalization", 201),
        "planner-bob": (apps.planner, "bob", "personalization", 201),
        "planner-alice-2": (apps.planner, "alice", "personalization", 201),
        "rogue": (rogue, "alice", "personalization", 403),
        # The policy lets a scheduler capture for scheduling; alice consented to none.
        "calendar-no-consent": (apps.calendar, "alice", "scheduling", 403),
        "planner-nobody": (apps.planner, "nobody-we-know", "personalization", 403),
    }
    answers: dict[str, list[httpx.Response]] = {name: [] for name in plan}
    start = threading.Barrier(len(plan))

    def client(name: str) -> None:
        key, subject, purpose, _ = plan[name]
        with httpx.Client(base_url=server.url, timeout=60) as own:
            start.wait()
            for n in range(ROUNDS):
                answers[name].append(
                    own.post(
                        "/v1/captures",
                        headers=bearer(key),
                        json={
                            "subject": subject,
                            **interaction(f"I like tea {name} {n}", purpose=purpose),
                        },
                    )
                )

    threads = [threading.Thread(target=client, args=(name,)) for name in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)

    for name, (_, _, _, status) in plan.items():
        assert [r.status_code for r in answers[name]] == [status] * ROUNDS, (
            name,
            [r.text for r in answers[name]],
        )
    assert {r.json()["error"]["code"] for r in answers["rogue"]} == {"permission_denied"}
    assert {r.json()["error"]["code"] for r in answers["calendar-no-consent"]} == {
        "consent_required"
    }
    accepted = [
        r.json()["capture_id"]
        for name in ("planner-alice", "planner-bob", "planner-alice-2")
        for r in answers[name]
    ]
    in_log = _captures_in_log(kernel)
    assert sorted(in_log) == sorted(accepted)  # the refused wrote nothing
    assert all(in_log[c] == 1 for c in accepted)
    # The allowed ones went through the writer, some of them together.
    grouped = writer.grouped_requests - grouped_before
    assert grouped >= len(accepted)
    assert writer.groups - groups_before < grouped
    # Every refusal is audited: the policy's denials, the consent gate's and the unknown.
    denied = list(kernel.audit_log.entries(action="access.denied"))[denied_before:]
    assert [d.entry["app_id"] for d in denied].count("app:rogue") == ROUNDS
    reasons = Counter(
        r.entry["reason_code"] for r in kernel.audit_log.entries(action="capture.refused")
    )
    assert reasons["consent-not-in-force"] + reasons["no-consent-on-record"] >= 2 * ROUNDS
    assert reasons["no-consent-on-record"] >= ROUNDS
