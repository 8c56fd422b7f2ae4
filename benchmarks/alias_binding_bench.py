"""What binding a session id or an identifier costs (decision 0121-read-then-write-sweep).

``python -m benchmarks.alias_binding_bench --runs 5 --calls 500`` from the tree's root
(``--postgres URL``: also on PostgreSQL, trust auth; a database of its own is created and
dropped).

``SubjectKeyStore.bind_alias`` replaced a binding with a DELETE then an INSERT in one
transaction (``before``); it is now one ``INSERT ... ON CONFLICT DO UPDATE`` built by the
backend (``now``, bug CM). Both shapes run here on the key store's ``subject_aliases``
table, alternately in each run, as the key store's engine runs them (SQLite: the key
store's FULL synchronous setting). Two cases per shape: a new alias each call, and the
same alias rebound each call. Per call, the median over ``--runs`` runs, in ms (wall).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from uprof.backends import backend_for_url
from uprof.crypto.tables import metadata, subject_aliases


def _row(alias: str, stream: str) -> dict[str, Any]:
    return {
        "alias_hash": alias,
        "kind": "session",
        "tenant": "bench",
        "stream_id": stream,
        "created_at": datetime.now(UTC),
    }


def _before(engine: sa.Engine, row: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(
            subject_aliases.delete().where(subject_aliases.c.alias_hash == row["alias_hash"])
        )
        conn.execute(subject_aliases.insert().values(**row))


def _now(engine: sa.Engine, row: dict[str, Any]) -> None:
    c = subject_aliases.c
    statement = backend_for_url(str(engine.url)).upsert(
        subject_aliases, [row], [c.alias_hash], {k: v for k, v in row.items() if k != "alias_hash"}
    )
    with engine.begin() as conn:
        conn.execute(statement)


def _per_call_ms(
    engine: sa.Engine, bind: Callable[[sa.Engine, dict[str, Any]], None], calls: int, *, same: bool
) -> float:
    with engine.begin() as conn:
        conn.execute(subject_aliases.delete())
    started = time.perf_counter()
    for i in range(calls):
        alias = "rebound" if same else uuid.uuid4().hex
        bind(engine, _row(alias, f"stream-{i % 7}"))
    return (time.perf_counter() - started) / calls * 1000


def _measure(url: str, runs: int, calls: int) -> dict[str, float]:
    engine = backend_for_url(url).create_engine(url, fsync_each_commit=True)
    try:
        metadata.create_all(engine)
        out: dict[str, list[float]] = {}
        for _ in range(runs):
            for same in (False, True):
                case = "rebind" if same else "new"
                for name, bind in (("before", _before), ("now", _now)):
                    out.setdefault(f"{case}_{name}_ms", []).append(
                        _per_call_ms(engine, bind, calls, same=same)
                    )
        metadata.drop_all(engine)
        return {k: round(statistics.median(v), 3) for k, v in out.items()}
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--postgres", default="")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        results["sqlite"] = _measure(
            f"sqlite:///{Path(folder) / 'keys.sqlite'}", args.runs, args.calls
        )
    if args.postgres:
        name = f"uprof_alias_{uuid.uuid4().hex[:8]}"
        admin = sa.create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = sa.make_url(args.postgres).set(database=name).render_as_string(hide_password=False)
        try:
            results["postgres"] = _measure(url, args.runs, args.calls)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
            admin.dispose()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
