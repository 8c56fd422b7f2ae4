"""A long-running process that holds a kernel, for the multi-process residue tests.

It stands for ``uprof serve``: open connections on every store, writes acknowledged
to its caller, and the residue scan run inside it. One JSON command per stdin line,
one JSON answer per stdout line:

* ``{"op": "write", "subject": s, "text": t}``: grant consent on first use, capture;
  answers the capture id once the write is acknowledged;
* ``{"op": "scan", "terms": [...]}``: the residue scan, in this process;
* ``{"op": "read", "subjects": [...], "capture_ids": [...]}``: which of them this
  process sees (after processing the log);
* ``{"op": "fds"}``: where this process's descriptors point (``/proc/self/fd``);
* ``{"op": "quit"}``.

The store comes from the environment (``UPROF_DATA_DIR``, ``UPROF_DATABASE_URL``).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from domain.values import Interaction
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel
from uprof.settings import Settings


def main() -> None:
    kernel = build_kernel(Settings(embedder="hashing"), FakeClock())
    consented: set[str] = set()
    answer({"ready": True, "pid": os.getpid()})
    try:
        for line in sys.stdin:
            command = json.loads(line)
            op = command["op"]
            if op == "quit":
                break
            if op == "write":
                subject = command["subject"]
                if subject not in consented:
                    kernel.grant_consent(
                        subject, app_id=APP, categories=["*"], purposes=["personalization"]
                    )
                    consented.add(subject)
                ack = kernel.capture(subject, interaction(command["text"]))
                answer({"capture_id": ack.capture_id, "notification_id": ack.notification_id})
            elif op == "scan":
                report = kernel.residue_scan(command["terms"])
                answer({"findings": [f.location for f in report.findings]})
            elif op == "read":
                kernel.process()
                found = kernel.queries.captures(command["capture_ids"])
                known = [s for s in command["subjects"] if kernel.subjects.find(s) is not None]
                answer({"capture_ids": sorted(found), "subjects": known})
            elif op == "fds":
                answer({"fds": descriptors()})
            else:
                answer({"error": f"unknown op {op!r}"})
    finally:
        kernel.close()


def interaction(text: str) -> Interaction:
    return Interaction(
        app_id=APP,
        agent_id="agent:one",
        occurred_at=datetime(2025, 1, 1, 9, tzinfo=UTC),
        user_input=text,
        source_ref="",
        sharing="shared",
        purpose="personalization",
        session_id="s1",
    )


def descriptors() -> list[str]:
    out = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            continue  # the descriptor listing the folder itself, closed meanwhile
    return out


def answer(payload: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
