"""Two ``uprof serve`` processes on one store (one SQLite folder, or one PostgreSQL
database), clients capturing the same subjects through both: each server's capture
writer groups its own requests, and the two only meet at the event log's version
check (decision 0008). Every capture answered 201 is in the log exactly once, each
stream's versions are gapless, and the audit log verifies."""

from __future__ import annotations

import subprocess
import threading
from collections import Counter

import httpx

from benchmarks.reliability import PLANNER, Target, grant_all, kernel_on, make_settings
from benchmarks.server_ready import stop_server
from tests.reliability.test_group_commit_crash import _start_server, _stored_captures

SUBJECTS = [f"two-servers-{i}" for i in range(3)]
CLIENTS_PER_SERVER = 4
CAPTURES_PER_CLIENT = 12


def test_two_servers_on_one_store_lose_and_double_nothing(target: Target) -> None:
    from uprof.api import ApiKeyStore

    with kernel_on(target) as kernel:
        for subject in SUBJECTS:
            grant_all(kernel, subject)
    keys = ApiKeyStore.open(make_settings(target))
    try:
        token = keys.create(PLANNER).token
    finally:
        keys.close()

    servers: list[tuple[subprocess.Popen[bytes], str]] = []
    answers: list[tuple[str, int, str]] = []  # (marker, status, capture id or error code)
    lock = threading.Lock()

    def client(url: str, index: int) -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http:
            for n in range(CAPTURES_PER_CLIENT):
                marker = f"I want to try two-server marker {index}x{n}"
                response = http.post(
                    "/v1/captures",
                    json={
                        "subject": SUBJECTS[(index + n) % len(SUBJECTS)],
                        "agent_id": "agent:one",
                        "user_input": marker,
                        "occurred_at": "2025-02-01T10:00:00Z",
                        "purpose": "personalization",
                        "sharing": "shared",
                    },
                )
                body = response.json()
                outcome = (
                    body["capture_id"] if response.status_code == 201 else body["error"]["code"]
                )
                with lock:
                    answers.append((marker, response.status_code, outcome))

    logs = [target.data_dir.parent / f"server-{i}.stderr" for i in range(2)]
    try:
        # Inside the try: a second server that does not start leaves no first one running.
        servers.extend(_start_server(target, log) for log in logs)
        threads = [
            threading.Thread(target=client, args=(url, s * CLIENTS_PER_SERVER + c))
            for s, (_, url) in enumerate(servers)
            for c in range(CLIENTS_PER_SERVER)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        stopped = [stop_server(process) for process, _ in servers]
    said = " | ".join(
        f"server {i} exit {code}: {log.read_text()[-3000:]!r}"
        for i, (code, log) in enumerate(zip(stopped, logs, strict=False))
    )
    assert None not in stopped, f"a server did not stop within 60 s of SIGTERM: {said}"

    total = 2 * CLIENTS_PER_SERVER * CAPTURES_PER_CLIENT
    assert len(answers) == total, said  # a server that went away says why in its log
    # Collisions between the servers are retried, never surfaced: every request is a 201.
    assert [a for a in answers if a[1] != 201] == []
    with kernel_on(target) as kernel:
        stored = _stored_captures(kernel)
        for subject in SUBJECTS:
            events = kernel.app.recorder.select_events(kernel.stream_of(subject))
            versions = [e.originator_version for e in events]
            assert versions == list(range(1, len(versions) + 1))
        accepted = list(kernel.audit_log.entries(action="capture.accepted"))
        kernel.audit_log.verify_integrity()
    by_id = Counter(capture_id for capture_id, _ in stored)
    by_marker = Counter(text for _, text in stored)
    assert sorted(by_id) == sorted(cid for _, _, cid in answers)
    assert set(by_id.values()) == {1}
    assert set(by_marker.values()) == {1} and len(by_marker) == total
    assert len(accepted) == total
