"""Reliability and security scenarios: crash, concurrency, leakage, erasure, tampering, soak.

Each scenario is a function taking its size and returning a dict of figures; the tests in
``tests/reliability`` run short versions and assert on the figures, ``main(argv)`` runs the
long versions and writes ``docs/bench/reliability.json``.

    python -m benchmarks.reliability                       # everything, long sizes
    python -m benchmarks.reliability --only crash --crash-kills 10
    uprof bench reliability run --only leakage --slices 100000   (once mounted by the CLI)

The crash scenario starts child processes with ``python -m benchmarks.reliability --child ...``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from domain.errors import SubjectNotFoundError

if TYPE_CHECKING:
    from uprof.kernel import Uprof
    from uprof.ports import Extractor
    from uprof.services.erasure import ErasureResult

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "bench" / "reliability.json"
POSTGRES_ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PLANNER = "app:planner"
CALENDAR = "app:calendar"
#: How long a child process may take to say it is ready (its first line) before it is
#: killed: start-up imports the project and opens the stores, seconds on a busy machine.
START_TIMEOUT_S = 300.0


# --------------------------------------------------------------------------- plumbing


@dataclass(frozen=True)
class Target:
    """Where a scenario's data lives: a data folder plus, for PostgreSQL, a database URL."""

    kind: str  # "sqlite" | "postgres"
    data_dir: Path
    database_url: str | None = None


def line_within(stream: Any, timeout_s: float, kill: Callable[[], None]) -> str | None:
    """The next line of a child's ``stream`` ("" at its end); or, if none came within
    ``timeout_s``, None once ``kill`` (which must end the child) has ended the read.

    A plain ``readline`` waits for ever on a child that hangs. The stream is free again
    on return (``communicate`` may read the rest)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not reader.is_alive():
        return got[0]
    kill()
    reader.join(60)  # the child is gone: its stdout ends
    return None


def make_settings(target: Target, **overrides: Any) -> Any:
    from uprof.settings import Settings

    return Settings(
        data_dir=target.data_dir,
        database_url=target.database_url,
        embedder="hashing",
        extractor="rules",
        **overrides,
    )


def open_kernel(
    target: Target,
    *,
    extractor: Extractor | None = None,
    partitions: Sequence[int] | None = None,
    **overrides: Any,
) -> Uprof:
    from uprof.adapters.embeddings import HashingEmbedder
    from uprof.bootstrap import bootstrap

    return bootstrap(
        make_settings(target, **overrides),
        embedder=HashingEmbedder(),
        extractor=extractor,
        partitions=partitions,
    )


def view_digest(kernel: Uprof, stream_ids: Sequence[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every view row of these streams, sorted (``SqlViewStore.table_digest``: the adapter's
    own check, not part of the ``ViewStore`` port the kernel is typed with)."""
    from projections.profile.views import SqlViewStore

    queries = kernel.queries
    if not isinstance(queries, SqlViewStore):
        raise TypeError(f"no view digest from {type(queries).__name__}")
    return queries.table_digest(stream_ids)


@contextmanager
def kernel_on(target: Target, **kw: Any) -> Iterator[Uprof]:
    kernel = open_kernel(target, **kw)
    try:
        yield kernel
    finally:
        kernel.close()


@contextmanager
def temp_target(kind: str) -> Iterator[Target]:
    """A fresh SQLite folder or PostgreSQL database, removed afterwards (for the command)."""
    import sqlalchemy as sa

    with tempfile.TemporaryDirectory(prefix="uprof-rel-") as tmp:
        if kind == "sqlite":
            yield Target("sqlite", Path(tmp) / "data")
            return
        name = f"uprof_rel_{uuid.uuid4().hex[:12]}"
        admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
            url = sa.engine.make_url(POSTGRES_ADMIN_URL).set(database=name)
            yield Target("postgres", Path(tmp) / "data", url.render_as_string(hide_password=False))
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def interaction(text: str, *, app: str = PLANNER, agent: str = "agent:one", **kw: Any) -> Any:
    from domain.values import Interaction

    return Interaction(
        app_id=app,
        agent_id=agent,
        occurred_at=datetime.now(UTC),
        user_input=text,
        sharing=kw.pop("sharing", "shared"),
        purpose=kw.pop("purpose", "personalization"),
        **kw,
    )


def grant_all(kernel: Any, subject: str, app: str = PLANNER) -> str:
    consent_id: str = kernel.grant_consent(
        subject, app_id=app, categories=["*"], purposes=["personalization"]
    )
    return consent_id


def captured_ids(kernel: Any, subjects: Sequence[str]) -> list[str]:
    """Every capture id in the captures view for these subjects (duplicates kept)."""
    out: list[str] = []
    for s in subjects:
        out.extend(r.capture_id for r in kernel.queries.all_captures(str(kernel.stream_of(s))))
    return out


def converges(kernel: Any) -> bool:
    """Live views equal a clean rebuild (I11)."""
    kernel.reads.drain()  # reads still with the recorder: the rebuild would see them
    kernel.process()
    live = kernel.queries.table_digest()
    kernel.rebuild()
    same: bool = kernel.queries.table_digest() == live
    return same


def percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": q(1.0)}


# --------------------------------------------------------------------------- 1. crash

CRASH_SUBJECTS = [f"crash-{i}" for i in range(4)]
#: Notifications per batch in the process() child (see ``_child``).
PROCESS_CHILD_BATCH = 4


def _child(argv: Sequence[str]) -> int:
    """The crash victim: captures (printing each acked id) or runs process()."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["capture", "process"])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    target = Target(
        "postgres" if args.database_url else "sqlite", Path(args.data_dir), args.database_url
    )
    rng = random.Random(args.seed)
    if args.mode == "process":
        # Small batches, each reported once committed, so the parent can kill it between
        # two of them with work still left (a kill after DONE would test nothing).
        kernel = open_kernel(target, projection_batch_size=PROCESS_CHILD_BATCH)
        print("READY", flush=True)
        kernel.process(progress=lambda _position, _end: print("STEP", flush=True))
        print("DONE", flush=True)
        return 0
    kernel = open_kernel(target)
    print("READY", flush=True)
    n = 0
    while True:
        subject = rng.choice(CRASH_SUBJECTS)
        batch = [
            interaction(f"I want to visit place crash{args.seed}x{n + k} soon")
            for k in range(rng.choice([1, 1, 3]))
        ]
        n += len(batch)
        for ack in kernel.capture_many(subject, batch):
            print(ack.capture_id, flush=True)


def child_args(target: Target, mode: str, seed: int) -> list[str]:
    """The arguments of ``_child`` (after ``--child``) for a crash victim on ``target``."""
    args = [mode, "--data-dir", str(target.data_dir), "--seed", str(seed)]
    if target.database_url:
        args += ["--database-url", target.database_url]
    return args


#: Starts a crash victim: ``(target, mode, seed)`` to a ``Popen``-like process whose
#: ``stdout`` is read line by line as the child writes it.
Spawn = Callable[[Target, str, int], Any]


def _spawn(target: Target, mode: str, seed: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "benchmarks.reliability", "--child"]
    cmd += child_args(target, mode, seed)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _kill_after_ready(proc: Any, delay: float, *, after_steps: int = 0) -> tuple[list[str], str]:
    """Wait for READY (and ``after_steps`` STEP lines), sleep ``delay``, SIGKILL; return
    the complete stdout lines after READY."""
    assert proc.stdout is not None
    first = line_within(proc.stdout, START_TIMEOUT_S, proc.kill)
    if first is None or first.strip() != "READY":
        proc.kill()
        _, err = proc.communicate()
        said = f"nothing within {START_TIMEOUT_S:.0f} s" if first is None else repr(first)
        raise RuntimeError(f"child did not start: {said} {err[-2000:]}")
    early: list[str] = []
    while len(early) < after_steps:
        # None: it stopped reporting for START_TIMEOUT_S, and was killed (as below).
        line = line_within(proc.stdout, START_TIMEOUT_S, proc.kill)
        if not line:
            break
        early.append(line)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate()
    # Only lines that were written completely (with their newline) count as acknowledged.
    lines = [line for line in [*early, *out.splitlines(keepends=True)] if line.endswith("\n")]
    return [line.strip() for line in lines], err


def crash_scenario(
    target: Target,
    *,
    kills: int,
    process_kills: int,
    seed: int = 1,
    max_delay: float = 0.8,
    spawn: Spawn = _spawn,
) -> dict[str, Any]:
    """``spawn`` starts each victim (default: ``python -m benchmarks.reliability --child``;
    the tests fork it from a process that has the project imported already)."""
    rng = random.Random(seed)
    with kernel_on(target) as kernel:
        for s in CRASH_SUBJECTS:
            grant_all(kernel, s)
    acked: list[str] = []
    killed_running = 0
    for round_ in range(kills):
        proc = spawn(target, "capture", seed * 1000 + round_)
        lines, _ = _kill_after_ready(proc, rng.uniform(0.05, max_delay))
        killed_running += proc.returncode == -signal.SIGKILL
        acked.extend(lines)
    process_rounds_interrupted = 0
    for round_ in range(process_kills):
        with kernel_on(target) as kernel:
            for k in range(rng.randint(20, 60)):
                subject = rng.choice(CRASH_SUBJECTS)
                ack = kernel.capture(subject, interaction(f"I want to see proc{round_}x{k}"))
                acked.append(ack.capture_id)
        proc = spawn(target, "process", seed * 2000 + round_)
        # Killed between two committed batches (or inside the next), with many left.
        lines, _ = _kill_after_ready(proc, 0.0, after_steps=rng.randint(1, 4))
        process_rounds_interrupted += (
            proc.returncode == -signal.SIGKILL and "STEP" in lines and "DONE" not in lines
        )
    with kernel_on(target) as kernel:
        kernel.process()
        stored = captured_ids(kernel, CRASH_SUBJECTS)
        counts = Counter(stored)
        stored_set = set(stored)
        lost = [a for a in acked if a not in stored_set]
        duplicated = [c for c, n in counts.items() if n > 1]
        log_events = kernel.app.max_notification_id()
        audit_ok = True
        try:
            kernel.audit_log.verify_integrity()
        except Exception:
            audit_ok = False
        converged = converges(kernel)
    return {
        "backend": target.kind,
        "capture_kills": kills,
        "process_kills": process_kills,
        "children_killed_by_sigkill": killed_running,
        "process_runs_interrupted_before_done": process_rounds_interrupted,
        "acked": len(acked),
        "acked_unique": len(set(acked)),
        "stored": len(stored),
        "stored_not_acked_(in_flight_at_kill)": len(stored_set - set(acked)),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "log_position": log_events,
        "audit_integrity_ok": audit_ok,
        "rebuild_equals_live": converged,
    }


# --------------------------------------------------------------------------- 2. concurrency


def concurrency_scenario(
    target: Target, *, threads: int = 8, per_thread: int = 10, subjects: int = 1
) -> dict[str, Any]:
    from domain.errors import VersionConflictError

    names = [f"conc-{i}" for i in range(subjects)]
    with kernel_on(target) as kernel:
        for s in names:
            grant_all(kernel, s)
        conflicts: Counter[str] = Counter()
        real_save = kernel.app.save

        def counting_save(*a: Any, **kw: Any) -> Any:
            try:
                return real_save(*a, **kw)
            except VersionConflictError:
                conflicts["conflict"] += 1
                raise

        # An instance attribute shadowing the method: counts conflicts, then re-raises.
        vars(kernel.app)["save"] = counting_save
        acked: list[str] = []
        errors: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(threads)
        latencies: list[float] = []

        def writer(w: int) -> None:
            rng = random.Random(w)
            barrier.wait()
            for k in range(per_thread):
                subject = rng.choice(names)
                t0 = time.perf_counter()
                try:
                    ack = kernel.capture(subject, interaction(f"writer {w} note {k} conc"))
                except Exception as e:
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    acked.append(ack.capture_id)

        pool = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        del vars(kernel.app)["save"]  # the method again
        kernel.process()
        stored = captured_ids(kernel, names)
        converged = converges(kernel)
    return {
        "backend": target.kind,
        "threads": threads,
        "subjects": subjects,
        "attempted": threads * per_thread,
        "acked": len(acked),
        "stored": len(stored),
        "lost": len(set(acked) - set(stored)),
        "duplicated": len(stored) - len(set(stored)),
        "errors": len(errors),
        "error_samples": errors[:3],
        "conflicts_retried": conflicts["conflict"],
        "capture_latency": percentiles(latencies),
        "rebuild_equals_live": converged,
    }


# --------------------------------------------------------------------------- 3. leakage

MARKER_RE = re.compile(r"\bzq[a-z0-9]+zq\b")
LEAK_CATEGORIES = ("preference", "diet", "health", "location", "schedule", "goal", "contact")
AGENTS = {"agent:a": "coach", "agent:b": "coach", "agent:c": "travel", "agent:d": "chef"}
SHARINGS = ("private", "shared", "shared:coach", "shared:travel,chef", "Shared!", "")
#: What each app's role may read, per the packaged seed policy (policies/seed_policy.csv).
POLICY_READ = {
    (PLANNER, "personalization"): {
        "preference",
        "diet",
        "language",
        "conversation",
        "goal",
        "schedule",
        "experience",
    },
    (CALENDAR, "scheduling"): {"schedule", "goal", "contact", "location"},
}
_CAT_RE = re.compile(r"\bcat ([a-z]+)\b")


class MarkerExtractor:
    """One memory per capture, in the category named in the text ("cat diet")."""

    name = "marker"

    def extract(self, capture: Any) -> Any:
        from domain.values import MemoryProposal, ProposalBatch

        i = capture.interaction
        m = _CAT_RE.search(i.user_input)
        return ProposalBatch(
            (
                MemoryProposal(
                    text=i.user_input,
                    evidence=(capture.capture_id,),
                    category=m.group(1) if m else "conversation",
                ),
            ),
            author="marker",
            owner_agent=i.agent_id,
            sharing=i.sharing,
            app_id=i.app_id,
            purpose=i.purpose,
        )


def visible_oracle(owner: str, sharing: str, agent: str, agent_type: str) -> bool:
    """I4 restated independently: private to the owner; malformed or missing = private."""
    if agent == owner:
        return True
    m = re.fullmatch(r"shared(?::([a-z0-9_.-]+(?:,[a-z0-9_.-]+)*))?", sharing)
    if not m:
        return False
    return m.group(1) is None or agent_type in m.group(1).split(",")


def leakage_scenario(
    target: Target, *, subjects: int = 4, captures: int = 60, slices: int = 300, seed: int = 7
) -> dict[str, Any]:
    rng = random.Random(seed)
    names = [f"leak-{i}" for i in range(subjects)]
    markers: dict[str, dict[str, str]] = {}
    capture_owner: dict[str, str] = {}
    consented: dict[tuple[str, str], set[str]] = {}
    with kernel_on(target, extractor=MarkerExtractor()) as kernel:
        for s in names:
            grant_all(kernel, s)
            consented[(s, PLANNER)] = set(LEAK_CATEGORIES) | {"conversation"}
            if rng.random() < 0.75:
                cats = rng.sample(["schedule", "location", "health", "goal", "diet"], 3)
                kernel.grant_consent(s, app_id=CALENDAR, categories=cats, purposes=["scheduling"])
                consented[(s, CALENDAR)] = set(cats)
        for n in range(captures):
            s = rng.choice(names)
            agent = rng.choice(list(AGENTS))
            sharing = rng.choice(SHARINGS)
            cat = rng.choice(LEAK_CATEGORIES)
            marker = f"zq{n}s{names.index(s)}zq"
            markers[marker] = {"subject": s, "owner": agent, "sharing": sharing, "category": cat}
            text = f"note {marker} cat {cat} about trips food meetings and plans"
            ack = kernel.capture(s, interaction(text, agent=agent, sharing=sharing))
            capture_owner[ack.capture_id] = s
        kernel.process()
        served = 0
        private_served_to_owner = 0
        refused_without_consent = 0
        leaks: Counter[str] = Counter()
        samples: list[str] = []
        latencies: list[float] = []
        readers = [
            (PLANNER, "personalization"),
            (CALENDAR, "scheduling"),
            ("app:rogue", "personalization"),
        ]
        for _ in range(slices):
            s = rng.choice(names)
            app, purpose = rng.choice(readers)
            agent = rng.choice([*AGENTS, "agent:x"])
            agent_type = AGENTS.get(agent, rng.choice(["", "coach", "travel"]))
            query = rng.choice(["trips", "food", "meetings", "plans", "health", "note"])
            t0 = time.perf_counter()
            try:
                result = kernel.slice(
                    s,
                    query,
                    budget_tokens=rng.choice([64, 256, 2000]),
                    purpose=purpose,
                    app_id=app,
                    agent_id=agent,
                    agent_type=agent_type,
                    lexical_only=rng.random() < 0.5,
                )
            except SubjectNotFoundError:
                # An app holding no consent of the subject is answered as for an
                # unknown subject; one that holds a consent must be served.
                latencies.append(time.perf_counter() - t0)
                if (s, app) in consented:
                    leaks["refused_with_consent"] += 1
                else:
                    refused_without_consent += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if (s, app) not in consented:
                leaks["served_without_consent"] += 1
                samples.append(f"{app} was served a slice of {s} without any consent")
            allowed = POLICY_READ.get((app, purpose), set()) & consented.get((s, app), set())
            for item in result.items:
                served += 1
                found = MARKER_RE.findall(item.text)
                if not found:
                    leaks["unverifiable_item"] += 1
                for ev in item.evidence:
                    if capture_owner.get(ev) != s:
                        leaks["foreign_evidence"] += 1
                if item.category not in allowed:
                    leaks["outside_policy_or_consent"] += 1
                    samples.append(f"{app} got {item.category} for {s}")
                for mk in found:
                    meta = markers[mk]
                    if meta["subject"] != s:
                        leaks["other_subject"] += 1
                    if not visible_oracle(meta["owner"], meta["sharing"], agent, agent_type):
                        leaks["private_to_non_owner"] += 1
                        samples.append(f"{agent}/{agent_type} saw {meta}")
                    elif meta["owner"] == agent and not visible_oracle(
                        meta["owner"], meta["sharing"], "agent:nobody", ""
                    ):
                        private_served_to_owner += 1
                if MARKER_RE.sub("", result.text) and any(
                    markers[m]["subject"] != s for m in MARKER_RE.findall(result.text)
                ):
                    leaks["other_subject_in_text"] += 1
    return {
        "backend": target.kind,
        "subjects": subjects,
        "captures": captures,
        "slices": slices,
        "items_served": served,
        "private_items_served_to_their_owner": private_served_to_owner,
        "private_to_non_owner": leaks["private_to_non_owner"],
        "outside_policy_or_consent": leaks["outside_policy_or_consent"],
        "served_without_consent": leaks["served_without_consent"],
        "refused_without_consent": refused_without_consent,
        "refused_with_consent": leaks["refused_with_consent"],
        "other_subject": leaks["other_subject"]
        + leaks["foreign_evidence"]
        + leaks["other_subject_in_text"],
        "unverifiable_items": leaks["unverifiable_item"],
        "leak_samples": samples[:5],
        "slice_latency": percentiles(latencies),
    }


# --------------------------------------------------------------------------- 4. erasure


#: Columns that reads legitimately move (visit counts, read log), by table.
READ_TRACKING = {
    "memories": {"visits", "last_visited_at"},
    "profile_subjects": {"last_notification_id"},
}


def _without_reads(digest: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """Bystanders are read during the run: their read tracking moves, nothing else may."""
    from projections.profile import tables as t

    out: dict[str, list[tuple[Any, ...]]] = {}
    for table in t.SUBJECT_TABLES:
        if table.name == "item_reads" or table.name not in digest:
            continue
        names = [c.name for c in table.c if c.name != "embedding"]
        keep = [i for i, n in enumerate(names) if n not in READ_TRACKING.get(table.name, ())]
        out[table.name] = sorted((tuple(r[i] for i in keep) for r in digest[table.name]), key=repr)
    return out


def _unexpected(error: BaseException) -> str:
    """An unexpected error of a load thread, with the last frames it came from: a bare
    ``AssertionError: `` (seen once in CI, bug EX) names nothing without them."""
    frames = traceback.extract_tb(error.__traceback__)[-3:]
    where = " < ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames[::-1])
    return f"{type(error).__name__}: {error} at {where}"


def erasure_scenario(
    target: Target,
    *,
    erased: int = 3,
    writers: int = 2,
    readers: int = 2,
    seconds: float = 3.0,
    pause: float = 0.02,
) -> dict[str, Any]:
    from domain.errors import (
        ConcurrencyConflictError,
        ErasureIncompleteError,
        SubjectErasedError,
        SubjectNotFoundError,
    )

    victims = [f"victim-{i}" for i in range(erased)]
    writers_subjects = [f"writer-{i}" for i in range(writers)]
    bystanders = ["bystander-0", "bystander-1"]
    terms = {v: f"Qzv{i}residueterm" for i, v in enumerate(victims)}
    # Server mode: one background worker projects; readers and the erasure wait for it.
    # (Embedded mode with several threads each calling process() is a separate, known bug:
    # see tests/reliability/test_concurrency.py::test_embedded_process_from_many_threads.)
    with kernel_on(target, background_workers=True) as kernel:
        for s in victims + writers_subjects + bystanders:
            grant_all(kernel, s)
        for v in victims:
            kernel.capture_many(
                v, [interaction(f"I live in {terms[v]}"), interaction(f"I want to {terms[v]}")]
            )
        for b in bystanders:
            kernel.capture(b, interaction(f"I live in Bystanderville {b}"))
        kernel.process()
        bystander_streams = [str(kernel.stream_of(b)) for b in bystanders]
        before = _without_reads(view_digest(kernel, bystander_streams))
        stop = threading.Event()
        errors: list[str] = []
        acked: list[str] = []
        counts: Counter[str] = Counter()

        def write(w: int) -> None:
            k = 0
            while not stop.is_set():
                try:
                    acked.append(
                        kernel.capture(
                            writers_subjects[w], interaction(f"I want to write more {k}")
                        ).capture_id
                    )
                    counts["captures"] += 1
                except Exception as e:
                    errors.append(f"capture {_unexpected(e)}")
                k += 1
                time.sleep(pause)

        def read(r: int) -> None:
            rng = random.Random(r)
            while not stop.is_set():
                s = rng.choice(victims + writers_subjects + bystanders)
                try:
                    result = kernel.slice(
                        s,
                        "where do I live",
                        budget_tokens=256,
                        purpose="personalization",
                        app_id=PLANNER,
                        agent_id="agent:one",
                    )
                    counts["slices"] += 1
                    if s not in victims and any(t in result.text for t in terms.values()):
                        errors.append("victim term served to another subject")
                except (SubjectNotFoundError, SubjectErasedError):
                    counts["slices_refused_erased"] += 1
                except Exception as e:
                    errors.append(f"slice {_unexpected(e)}")

        def work() -> None:
            while not stop.is_set():
                try:
                    if kernel.process() == 0:
                        time.sleep(0.005)
                except Exception as e:
                    if isinstance(e, ConcurrencyConflictError):
                        # Extraction lost every race its retry policy allows: known
                        # starvation (docs/reliability.md); the loop simply tries again.
                        counts["extraction_conflicts_exhausted"] += 1
                    else:
                        errors.append(f"worker {_unexpected(e)}"[:600])

        pool = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        pool += [threading.Thread(target=read, args=(r,)) for r in range(readers)]
        pool.append(threading.Thread(target=work))
        for t in pool:
            t.start()
        receipts_ok = 0
        t0 = time.perf_counter()
        erase_times: list[float] = []
        incomplete: list[dict[str, int]] = []
        try:
            for v in victims:
                time.sleep(seconds / (erased + 1))
                e0 = time.perf_counter()
                try:
                    result = erase_as_a_client_does(kernel, v, incomplete)
                except ErasureIncompleteError as e:
                    # The report is lost with this exception: keep what the load threads
                    # saw (a worker that keeps failing is a stall the retry cannot cure).
                    seen = [x for x in errors if x.startswith("worker")] or errors
                    raise ErasureIncompleteError(f"{e}; load-thread errors: {seen[:3]}") from e
                erase_times.append(time.perf_counter() - e0)
                from audit.receipts import verify_receipt

                verify_receipt(
                    result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin
                )
                receipts_ok += 1
            time.sleep(max(0.0, seconds - (time.perf_counter() - t0)) / 2)
        finally:
            # Also when an erasure fails: otherwise the load threads run on after the
            # kernel closes, holding its connections into whatever runs next.
            stop.set()
            for t in pool:
                t.join()
        kernel.process()
        report = kernel.residue_scan(list(terms.values()))
        after = _without_reads(view_digest(kernel, bystander_streams))
        stored = set(captured_ids(kernel, writers_subjects))
        converged = converges(kernel)
    return {
        "backend": target.kind,
        "erased_subjects": erased,
        "receipts_verified": receipts_ok,
        "residue_findings": len(report.findings),
        "streams_checked": report.streams_checked,
        "bystanders_unchanged": before == after,
        "bystander_tables_changed": sorted(k for k in before if before[k] != after.get(k)),
        "concurrent_captures": counts["captures"],
        "concurrent_captures_lost": len(set(acked) - stored),
        "concurrent_slices": counts["slices"],
        "slices_refused_after_erasure": counts["slices_refused_erased"],
        "extraction_conflicts_exhausted": counts["extraction_conflicts_exhausted"],
        "unexpected_errors": len(errors),
        "error_samples": errors[:3],
        "erase_latency": percentiles(erase_times),
        "erasures_retried": len(incomplete),
        "lag_when_incomplete": incomplete,
        "rebuild_equals_live": converged,
    }


#: How often the scenario asks again after ``ErasureIncompleteError``, as a client told to
#: retry does (the error's hint, 503 ``erasure_incomplete`` in docs/api.md).
ERASURE_ATTEMPTS = 4


def erase_as_a_client_does(
    kernel: Uprof, subject: str, incomplete: list[dict[str, int]]
) -> ErasureResult:
    """Erase ``subject``, asking again while the erasure is incomplete (projections did
    not pass its tombstone within the wait bound). Each incomplete attempt appends the lag
    it left behind to ``incomplete``: a lag that shrinks from one attempt to the next is a
    machine too slow for the load, one that does not is a stalled worker."""
    from domain.errors import ErasureIncompleteError

    for attempt in range(1, ERASURE_ATTEMPTS):
        try:
            return kernel.erase_subject(subject)
        except ErasureIncompleteError:
            lag = kernel.lag()
            incomplete.append(
                {
                    "attempt": attempt,
                    "log_position": lag.log_position,
                    "extraction_pending": lag.extraction_pending,
                    "projection_pending": lag.projection_pending,
                }
            )
    try:
        return kernel.erase_subject(subject)
    except ErasureIncompleteError as e:
        raise ErasureIncompleteError(
            f"{e} after {ERASURE_ATTEMPTS} attempts; lag after each earlier one: {incomplete}"
        ) from e


# --------------------------------------------------------------------------- 5. tampering


def _mutate_lines(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    out = list(lines)
    kind = rng.randrange(5)
    if kind == 0:  # one byte changed
        k = rng.randrange(len(out))
        line = bytearray(out[k])
        pos = rng.randrange(len(line) - 1)  # keep the newline
        new = rng.randrange(256)
        while new == line[pos]:
            new = rng.randrange(256)
        line[pos] = new
        out[k] = bytes(line)
    elif kind == 1:  # a line deleted
        del out[rng.randrange(len(out))]
    elif kind == 2:  # two lines swapped
        i, j = rng.sample(range(len(out)), 2)
        out[i], out[j] = out[j], out[i]
    elif kind == 3:  # a line duplicated
        k = rng.randrange(len(out))
        out.insert(rng.randrange(len(out) + 1), out[k])
    else:  # a field value edited, re-serialized canonically
        import rfc8785

        k = rng.randrange(len(out))
        obj = json.loads(out[k])
        _mutate_leaf(rng, obj)
        out[k] = rfc8785.dumps(obj) + b"\n"
    return out


def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _leaves(v, (*path, i))] or [path]
    return [path]


def _mutate_leaf(rng: random.Random, obj: Any) -> None:
    path = rng.choice(_leaves(obj))
    if not path:
        return
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    if isinstance(old, bool):
        new: Any = not old
    elif isinstance(old, int):
        new = old + rng.choice([-1, 1, 1000])
    elif isinstance(old, str):
        new = (
            old + "x"
            if not old or rng.random() < 0.5
            else old[:-1] + ("A" if old[-1] != "A" else "B")
        )
    elif old is None:
        new = "x"
    else:
        new = None
    parent[path[-1]] = new


def tamper_scenario(target: Target, *, trials: int = 200, seed: int = 5) -> dict[str, Any]:
    from audit.errors import VerificationError
    from audit.export import export_jsonl
    from audit.receipts import verify_receipt
    from audit.verify import verify_export

    rng = random.Random(seed)
    with kernel_on(target) as kernel:
        for s in ("alice", "bob"):
            grant_all(kernel, s)
            kernel.capture_many(
                s, [interaction(f"I live in Town{s}"), interaction("I want to ski")]
            )
        kernel.slice(
            "alice",
            "where",
            budget_tokens=128,
            purpose="personalization",
            app_id=PLANNER,
            agent_id="agent:one",
        )
        receipt = kernel.erase_subject("bob").receipt
        buffer = io.StringIO()
        export_jsonl(kernel.audit_log, buffer)
        lines = buffer.getvalue().encode().splitlines(keepends=True)
        key, origin = kernel.audit_log.public_key, kernel.settings.audit_origin
        genuine = verify_export(lines, key, origin)
        verify_receipt(receipt, key, origin=origin)
        detected: Counter[str] = Counter()
        missed: list[str] = []
        for n in range(trials):
            mutated = _mutate_lines(rng, lines)
            if mutated == lines:
                continue
            try:
                verify_export(mutated, key, origin)
                missed.append(f"export trial {n}")
            except VerificationError:
                detected["export"] += 1
            forged = copy.deepcopy(receipt)
            _mutate_leaf(rng, forged)
            if forged == receipt:
                continue
            try:
                verify_receipt(forged, key, origin=origin)
                missed.append(f"receipt trial {n}")
            except VerificationError:
                detected["receipt"] += 1
    return {
        "backend": target.kind,
        "entries_in_export": genuine.entry_count,
        "export_mutations_detected": detected["export"],
        "receipt_mutations_detected": detected["receipt"],
        "undetected": len(missed),
        "undetected_samples": missed[:5],
    }


# --------------------------------------------------------------------------- 6. fuzz (importer)


def importer_fuzz(target: Target, *, examples: int = 300, seed: int = 11) -> dict[str, Any]:
    """Seeded random JSONL files (valid, broken, unconsented lines mixed), every other one
    strict; count outcomes. A run is per record: nothing may escape, the log must grow by
    exactly what the report counts as captured, and a strict run with a failed record
    must write nothing (``partial_writes`` counts any breach of either)."""
    from uprof.services.importer import import_interactions

    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    partial = 0
    failed_records = 0
    unexpected: list[str] = []
    with kernel_on(target) as kernel:
        grant_all(kernel, "alice")
        for number in range(examples):
            lines = [random_jsonl_line(rng) for _ in range(rng.randint(0, 6))]
            strict = number % 2 == 1
            before = kernel.app.max_notification_id()
            try:
                report = import_interactions(kernel, lines, strict=strict)
            except Exception as e:
                unexpected.append(f"{type(e).__name__}: {e}"[:200])
                continue
            written = kernel.app.max_notification_id() - before
            failed_records += len(report.failed)
            if report.refused:
                outcomes["strict_refused"] += 1
                partial += written != 0
            else:
                outcomes["with_failed_records" if report.failed else "clean"] += 1
                partial += written != report.captured
    return {
        "backend": target.kind,
        "files": examples,
        "outcomes": dict(outcomes),
        "failed_records": failed_records,
        "partial_writes": partial,
        "unexpected_exceptions": len(unexpected),
        "unexpected_samples": unexpected[:5],
    }


def random_jsonl_line(rng: random.Random) -> str:
    good = {
        "subject": "alice",
        "app_id": PLANNER,
        "agent_id": "agent:one",
        "user_input": "I want to import things",
        "occurred_at": "2025-01-01T09:00:00Z",
        "purpose": "personalization",
        "sharing": "shared",
    }
    choice = rng.randrange(8)
    if choice <= 2:
        return json.dumps(good)
    row: dict[str, Any] = dict(good)
    junk: list[Any] = [
        "",
        "\x00",
        "\ud800",
        "a" * 40_000,
        None,
        12,
        [],
        {},
        "2025-13-01",
        "1e309",
        "app planner",
        "bob",
        "\u202e",
        "nobody",
        -1,
        True,
    ]
    if choice == 3:
        return rng.choice(["{", "[]", "null", '"x"', '{"subject":}', "\x00", "{}" * 3])
    for _ in range(rng.randint(1, 3)):
        field = rng.choice([*good, "context", "agent_type", "extra_field"])
        row[field] = rng.choice(junk)
    try:
        return json.dumps(row)
    except (TypeError, ValueError):
        return "{broken"


# --------------------------------------------------------------------------- 7. soak


def rss_kib() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def soak_scenario(
    target: Target, *, seconds: float = 20.0, sample_every: float = 2.0, seed: int = 3
) -> dict[str, Any]:
    from domain.errors import SubjectNotFoundError

    rng = random.Random(seed)
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    samples: list[tuple[float, int]] = []
    with kernel_on(target) as kernel:
        serial = 0
        pool: list[str] = []
        calendar_consent: dict[str, str] = {}

        def new_subject() -> str:
            nonlocal serial
            serial += 1
            name = f"soak-{serial}"
            grant_all(kernel, name)
            return name

        pool = [new_subject() for _ in range(10)]
        ops: list[tuple[str, Callable[[], Any], float]] = []

        def op_capture() -> None:
            s = rng.choice(pool)
            kernel.capture(s, interaction(f"I want to try thing {rng.randrange(10**6)} today"))

        def op_slice() -> None:
            kernel.slice(
                rng.choice(pool),
                rng.choice(["goals", "plans", "where"]),
                budget_tokens=256,
                purpose="personalization",
                app_id=PLANNER,
                agent_id="agent:one",
            )

        def op_consent() -> None:
            s = rng.choice(pool)
            if s in calendar_consent:
                kernel.withdraw_consent(s, calendar_consent.pop(s))
            else:
                calendar_consent[s] = kernel.grant_consent(
                    s, app_id=CALENDAR, categories=["schedule"], purposes=["scheduling"]
                )

        def op_erase() -> None:
            s = pool.pop(rng.randrange(len(pool)))
            calendar_consent.pop(s, None)
            kernel.erase_subject(s)
            pool.append(new_subject())

        ops = [
            ("capture", op_capture, 0.45),
            ("slice", op_slice, 0.40),
            ("consent", op_consent, 0.10),
            ("erase", op_erase, 0.05),
        ]
        names = [o[0] for o in ops]
        funcs = {o[0]: o[1] for o in ops}
        weights = [o[2] for o in ops]
        start = time.monotonic()
        next_sample = start
        while True:
            now = time.monotonic()
            if now >= next_sample:
                samples.append((round(now - start, 1), rss_kib()))
                next_sample = now + sample_every
            # Three samples at least (the first, one after warm-up, the last), each
            # ``sample_every`` apart: on a busy machine an operation can outlast a sampling
            # period, and the run then goes on until the growth after warm-up is measured.
            if now - start >= seconds and len(samples) >= 3:
                break
            name = rng.choices(names, weights)[0]
            t0 = time.perf_counter()
            try:
                funcs[name]()
            except SubjectNotFoundError as e:
                errors.append(f"{name} {type(e).__name__}: {e}")
            except Exception as e:
                errors.append(f"{name} {type(e).__name__}: {e}"[:300])
            latencies[name].append(time.perf_counter() - t0)
        converged = converges(kernel)
    base = samples[1][1] if len(samples) > 2 else samples[0][1]
    return {
        "backend": target.kind,
        "seconds": seconds,
        "operations": {k: percentiles(v) for k, v in latencies.items()},
        "unexpected_errors": len(errors),
        "error_samples": errors[:5],
        "rss_kib_samples": samples,
        "rss_kib_first": samples[0][1],
        "rss_kib_after_warmup": base,
        "rss_kib_last": samples[-1][1],
        "rss_growth_kib_after_warmup": samples[-1][1] - base,
        "rebuild_equals_live": converged,
    }


# --------------------------------------------------------------------------- command

SCENARIOS = ("crash", "concurrency", "leakage", "erasure", "tamper", "fuzz", "soak")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__)
    p.add_argument("--only", action="append", choices=SCENARIOS)
    p.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    p.add_argument("--crash-kills", type=int, default=50)
    p.add_argument("--process-kills", type=int, default=10)
    p.add_argument("--writes-per-thread", type=int, default=100)
    p.add_argument("--slices", type=int, default=100_000)
    p.add_argument("--tamper-trials", type=int, default=5_000)
    p.add_argument("--fuzz-files", type=int, default=3_000)
    p.add_argument("--soak-seconds", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    chosen = args.only or list(SCENARIOS)
    backends = args.backend or ["sqlite", "postgres"]
    results: dict[str, Any] = {}
    if args.out.exists():
        try:
            results = json.loads(args.out.read_text())
        except ValueError:
            results = {}
    started = time.time()

    def record(
        name: str, kind: str, fn: Callable[[Target], dict[str, Any]], argstr: str, key: str = ""
    ) -> None:
        with temp_target(kind) as target:
            t0 = time.perf_counter()
            figures = fn(target)
            figures["wall_s"] = round(time.perf_counter() - t0, 1)
        figures["command"] = (
            f"python -m benchmarks.reliability --only {name} --backend {kind} {argstr}".strip()
        )
        results.setdefault(name, {})[key or kind] = figures
        print(json.dumps({name: {key or kind: figures}}, default=str), flush=True)

    for kind in backends:
        if "crash" in chosen:
            record(
                "crash",
                kind,
                lambda t: crash_scenario(
                    t, kills=args.crash_kills, process_kills=args.process_kills
                ),
                f"--crash-kills {args.crash_kills} --process-kills {args.process_kills}",
            )
        if "concurrency" in chosen:
            for subjects in (1, 16):
                record(
                    "concurrency",
                    kind,
                    functools.partial(
                        concurrency_scenario,
                        threads=8,
                        per_thread=args.writes_per_thread,
                        subjects=subjects,
                    ),
                    f"--writes-per-thread {args.writes_per_thread}",
                    key=f"{kind}-{subjects}-subjects",
                )
        if "leakage" in chosen:
            record(
                "leakage",
                kind,
                lambda t: leakage_scenario(t, subjects=8, captures=400, slices=args.slices),
                f"--slices {args.slices}",
            )
        if "erasure" in chosen:
            record(
                "erasure",
                kind,
                lambda t: erasure_scenario(t, erased=10, writers=3, readers=3, seconds=30.0),
                "",
            )
        if "tamper" in chosen:
            record(
                "tamper",
                kind,
                lambda t: tamper_scenario(t, trials=args.tamper_trials),
                f"--tamper-trials {args.tamper_trials}",
            )
        if "fuzz" in chosen:
            record(
                "fuzz",
                kind,
                lambda t: importer_fuzz(t, examples=args.fuzz_files),
                f"--fuzz-files {args.fuzz_files}",
            )
        if "soak" in chosen:
            record(
                "soak",
                kind,
                lambda t: soak_scenario(t, seconds=args.soak_seconds, sample_every=10.0),
                f"--soak-seconds {args.soak_seconds:g}",
            )
    results["_meta"] = {
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "last_run_wall_s": round(time.time() - started, 1),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
