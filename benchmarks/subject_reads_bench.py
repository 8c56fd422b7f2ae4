"""What recording subject reads and reusing checkpoints cost (one process, one tree).

``python -m benchmarks.subject_reads_bench --backend sqlite --runs 5`` from a tree's root
(``PYTHONPATH`` set to it); run it from each tree in turn to compare them.

One subject with a consent and a few memories (the kernel's own writes, no extraction).
Times, per call, medians over ``--runs`` runs of ``--calls`` calls:

- ``profile_page``: what the privacy center's profile page reads through the door for a
  data subject's session (``Facade.profile_page``; on a tree without it, the four door
  calls the page made before: ``subject_view``, ``list_memories``,
  ``evidence_captures``, ``item_reads``);
- ``profile_read``: ``Facade.profile`` for the local operator (``/v1/profile/read``);
- ``audit_key_poll``: ``Facade.audit_key`` for the local operator, the log unchanged
  between calls (``GET /v1/audit/key`` polled).

Prints JSON (wall ms and CPU ms per call); decision 0102-subject-reads-audited keeps them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from domain.principal import PRIVACY_CENTER, Principal, PrincipalKind
from uprof.facade import Facade


def _per_call(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (
        (time.perf_counter() - wall) / calls * 1e3,
        (time.process_time() - cpu) / calls * 1e3,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()

    from benchmarks.reliability import kernel_on, temp_target

    with temp_target(args.backend) as target, kernel_on(target) as kernel:
        run(args, kernel)


def run(args: argparse.Namespace, kernel: Any) -> None:
    operator = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    operator.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    user = Facade(
        kernel,
        Principal(
            kernel.subjects.tenant,
            PRIVACY_CENTER,
            "0123456789abcdef",
            PrincipalKind.USER,
            subject="alice",
        ),
    )

    def page() -> Any:
        if hasattr(user, "profile_page"):
            return user.profile_page("alice", memories=50)
        # The door's four calls before the page was one read (absent from this tree).
        door: Any = user
        view = door.subject_view("alice", with_memories=False)
        memories = door.list_memories("alice", limit=50)
        door.evidence_captures("alice", set())
        door.item_reads("alice")
        return view, memories

    measures: dict[str, Callable[[], Any]] = {
        "profile_page": page,
        "profile_read": lambda: operator.profile("alice"),
        "audit_key_poll": operator.audit_key,
    }
    for fn in measures.values():
        fn()  # warm
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in measures}
    for _ in range(args.runs):
        for name, fn in measures.items():
            results[name].append(_per_call(fn, args.calls))
    print(
        json.dumps(
            {
                "backend": args.backend,
                "tree": str(Path(__file__).resolve().parents[1].name),
                "has_profile_page": hasattr(user, "profile_page"),
                **{
                    name: {
                        "wall_ms": round(statistics.median(w for w, _ in runs), 3),
                        "cpu_ms": round(statistics.median(c for _, c in runs), 3),
                    }
                    for name, runs in results.items()
                },
                "audit_entries": kernel.audit_log.size(),
                "checkpoints": len(kernel.audit_log.checkpoints()),
            }
        )
    )


if __name__ == "__main__":
    main()
