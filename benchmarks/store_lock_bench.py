"""What asking a write's key under the event store's lock costs two processes saving at
once (0227-leftovers-of-0218-to-0223's bug US; 0231-review-of-0227).

    python -m benchmarks.store_lock_bench --database-url URL [--n 150] [--rounds 2]
    python -m benchmarks.store_lock_bench --sqlite [--n 150] [--rounds 2]

Two processes on one store each record ``--n`` first consent grants of subjects of their
own (each a save of a new stream), started together. ``armed``: the facade has a key
check (as a request with an API key), so each save asks it under the store's lock (on
PostgreSQL the events table's ``LOCK TABLE`` taken before the inserts, the pipeline
synced, the check asked). ``plain``: no check (the CLI's saves), the save path of before
0227. Prints grants per second of the pair (all grants over the wall time from the
common start to the last finish), each mode per round.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from uprof.settings import Settings

APP = "app:planner"


def _settings(data_dir: Path, database_url: str | None) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        embedder="hashing",
        background_workers=False,
    )


def child(data_dir: Path, database_url: str | None, mode: str, name: str, n: int) -> None:
    """Bootstrap, say ``ready``, wait for ``go`` on stdin, grant ``n``, print seconds."""
    from domain.principal import Principal, PrincipalKind
    from uprof.apikeys.store import ApiKeyStore
    from uprof.bootstrap import bootstrap
    from uprof.facade import Facade

    settings = _settings(data_dir, database_url)
    keys = ApiKeyStore.open(settings)
    key = next(k for k in keys.list(APP) if not k.is_revoked)
    kernel = bootstrap(settings)
    principal = Principal(settings.tenant, APP, key.key_id, PrincipalKind.APP, frozenset({"app"}))

    def stands() -> None:
        return None

    door = Facade(kernel, principal, still_authenticated=stands if mode == "armed" else None)
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.perf_counter()
    for i in range(n):
        door.grant_consent(
            f"{name}-{i}",
            categories=["*"],
            purposes=["personalization"],
            collected_by="bench:store-lock",
        )
    print(f"{time.perf_counter() - started:.4f}", flush=True)
    kernel.close()
    keys.close()


def _pair(data_dir: Path, database_url: str | None, mode: str, n: int) -> float:
    run = uuid.uuid4().hex[:8]
    argv = [sys.executable, "-m", "benchmarks.store_lock_bench", "--child", str(data_dir)]
    if database_url:
        argv += ["--database-url", database_url]
    children = [
        subprocess.Popen(
            [*argv, "--mode", mode, "--name", f"{mode}-{run}-{p}", "--n", str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(2)
    ]
    for c in children:
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
    start = time.perf_counter()
    for c in children:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    for c in children:
        assert c.stdout is not None
        c.stdout.readline()
        c.wait(600)
    return 2 * n / (time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--database-url", default=None)
    p.add_argument("--sqlite", action="store_true")
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    p.add_argument("--name", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        child(Path(args.child), args.database_url, args.mode, args.name, args.n)
        return 0
    if not args.sqlite and not args.database_url:
        p.error("give --database-url URL or --sqlite")
    from uprof.apikeys.store import ApiKeyStore
    from uprof.bootstrap import bootstrap

    with tempfile.TemporaryDirectory() as folder:
        data_dir = Path(folder) / "data"
        settings = _settings(data_dir, args.database_url)
        bootstrap(settings).close()  # the stores made once, before the children start
        keys = ApiKeyStore.open(settings)
        keys.create(APP)
        keys.close()
        for r in range(args.rounds):
            for mode in ("plain", "armed"):
                rate = _pair(data_dir, args.database_url, mode, args.n)
                print(f"round {r + 1} {mode}: {rate:.1f} grants/s (2 processes)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
