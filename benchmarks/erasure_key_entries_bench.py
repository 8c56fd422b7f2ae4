"""Time an event erasure's key entries append on SQLite, against a subject's capture history.

An event erasure appends, with ``once_by``, a late ``key.created`` for each capture key
(left out when a capture request's entry lists its commitment) and its ``key.destroyed``
(decision 0085-capture-key-created-at-erasure). The subject's log holds ``--history``
capture requests' ``key.created`` entries, one commitment each. Modes:

- ``destroyed``: ``key.destroyed`` alone (what an event erasure appended before);
- ``locked``: both entries, the ``once_by`` check only under the write lock;
- ``now``: both entries, what the log holds left out before the lock (the shipped code).

Run: ``.venv/bin/python -m benchmarks.erasure_key_entries_bench --history 10000 50000``.
Prints one JSON line per mode and size: medians of the whole append and of the time in
the write transaction (the lock every other append waits for).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.log import AuditLog, AuditRecord, OnceBy, _PreparedEntry
from audit.tables import create_tables
from uprof.backends import backend_for

SUBJECT = "sub_0001"
IDENTITY: OnceBy = ("request_id", ("dek_commitment", "dek_commitments"))
MODES = ("destroyed", "locked", "now")


def _commitment(i: int) -> str:
    return hashlib.sha256(f"key {i}".encode()).hexdigest()


class _TimedLog(AuditLog):
    """The log, timing its write transactions; ``locked`` skips the read before the lock."""

    def __init__(self, *args: Any, locked: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.locked = locked
        self.held_ms: list[float] = []

    def _write_typed(
        self,
        prepared: Sequence[_PreparedEntry],
        once_by: OnceBy = (),
        admitted: Callable[[], None] | None = None,
    ) -> list[AuditRecord]:
        return (
            self._write(prepared, once_by, admitted)
            if self.locked
            else super()._write_typed(prepared, once_by, admitted)
        )

    def _write(
        self,
        prepared: Sequence[_PreparedEntry],
        once_by: OnceBy = (),
        admitted: Callable[[], None] | None = None,
    ) -> list[AuditRecord]:
        start = time.perf_counter()
        try:
            return super()._write(prepared, once_by, admitted)
        finally:
            self.held_ms.append((time.perf_counter() - start) * 1000)


def run(mode: str, history: int, appends: int, workdir: Path) -> dict[str, Any]:
    engine = sa.create_engine(f"sqlite:///{workdir / f'{mode}-{history}.sqlite'}")
    backend = backend_for(engine)
    create_tables(engine, backend)
    log = _TimedLog(
        engine,
        Ed25519PrivateKey.generate(),
        "uprof.bench/erasure",
        backend=backend,
        locked=mode == "locked",
    )
    for lo in range(0, history, 1000):
        log.append_many(
            {
                "action": "key.created",
                "subject_ref": SUBJECT,
                "reason_code": "capture-key",
                "dek_commitments": [_commitment(i)],
            }
            for i in range(lo, min(history, lo + 1000))
        )
    whole: list[float] = []
    held: list[float] = []
    for r in range(appends):
        c = _commitment(r * 7 % max(history, 1))
        destroyed = {
            "action": "key.destroyed",
            "subject_ref": SUBJECT,
            "request_id": f"request-{r}",
            "reason_code": "capture-key",
            "dek_commitment": c,
        }
        late = {
            "action": "key.created",
            "subject_ref": SUBJECT,
            "reason_code": "recorded-at-erasure",
            "dek_commitments": [c],
        }
        entries: list[dict[str, Any]] = [destroyed] if mode == "destroyed" else [late, destroyed]
        log.held_ms.clear()
        start = time.perf_counter()
        log.append_many(entries, once_by=IDENTITY)
        whole.append((time.perf_counter() - start) * 1000)
        held.append(sum(log.held_ms))
    engine.dispose()
    return {
        "mode": mode,
        "history": history,
        "appends": appends,
        "append_ms_median": round(statistics.median(whole), 2),
        "write_lock_ms_median": round(statistics.median(held), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, nargs="+", default=[10_000, 50_000])
    parser.add_argument("--appends", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for history in args.history:
            for mode in MODES:
                print(json.dumps(run(mode, history, args.appends, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
