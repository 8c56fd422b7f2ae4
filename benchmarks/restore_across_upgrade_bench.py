"""What a restore across an upgrade costs (decision 0164-restore-across-upgrade, bug KH).

``python -m benchmarks.restore_across_upgrade_bench --backend sqlite|postgres --rounds N
[--subjects S]``

One deployment with ``S`` subjects (consent and three captures each, processed). Two
backups of it: one taken at the previous schema (the stores taken down one revision by
alembic's own downgrades, ``schema_downgrade.PREVIOUS``, then started again: the
upgrade), one at head. Each round restores the head backup, then the previous-schema one
(the order swapped every other round), timing ``uprof.services.backup.restore`` as a
call in this process (imports done by a first, untimed restore). Reports the medians,
wall and CPU, and the ratio old / same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def run(backend: str, rounds: int, subjects: int) -> dict[str, Any]:
    from benchmarks.reliability import (
        grant_all,
        interaction,
        kernel_on,
        make_settings,
        open_kernel,
        temp_target,
    )
    from benchmarks.schema_downgrade import PREVIOUS, downgrade_stores
    from uprof.services.backup import backup, restore
    from uprof.storage import layout_for

    with temp_target(backend) as target, tempfile.TemporaryDirectory() as tmp:
        settings = make_settings(target)
        with kernel_on(target) as k:
            for i in range(subjects):
                subject = f"bench-{i}"
                grant_all(k, subject)
                for j in range(3):
                    k.capture(subject, interaction(f"I live in Town{i} and like dish {j}"))
            k.process()
        downgrade_stores(layout_for(settings), PREVIOUS)
        old, same = Path(tmp) / "old", Path(tmp) / "same"
        backup(settings, old)
        open_kernel(target).close()  # the upgrade
        backup(settings, same)
        restore(settings, same)  # imports, caches: not timed
        times: dict[str, list[float]] = {"same": [], "old": []}
        cpu: dict[str, list[float]] = {"same": [], "old": []}
        for r in range(rounds):
            order = ("same", "old") if r % 2 == 0 else ("old", "same")
            for which in order:
                src = same if which == "same" else old
                began, began_cpu = time.perf_counter(), time.process_time()
                restore(settings, src)
                cpu[which].append((time.process_time() - began_cpu) * 1000)
                times[which].append((time.perf_counter() - began) * 1000)
        med = {k: statistics.median(v) for k, v in times.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        return {
            "backend": backend,
            "rounds": rounds,
            "subjects": subjects,
            "restore_same_revision_ms": round(med["same"], 1),
            "restore_previous_revision_ms": round(med["old"], 1),
            "ratio_wall": round(med["old"] / med["same"], 2),
            "restore_same_revision_cpu_ms": round(med_cpu["same"], 1),
            "restore_previous_revision_cpu_ms": round(med_cpu["old"], 1),
            "ratio_cpu": round(med_cpu["old"] / med_cpu["same"], 2),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--subjects", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(run(args.backend, args.rounds, args.subjects), indent=2))


if __name__ == "__main__":
    main()
