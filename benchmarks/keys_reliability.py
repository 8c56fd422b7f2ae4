"""SIGKILL at random points of erasure, backup and restore (decision 0012, issue 14).

Each run, on one deployment that keeps growing across runs:

1. capture canaries for two new subjects A and B, back up (``bk``);
2. a child erases A and is SIGKILLed (with its process group: pg_dump/pg_restore
   die too) at a random moment; the parent checks that an acknowledged erasure
   holds, finishes an unacknowledged one by retrying, and that B is intact;
3. a child backs up to a new folder and is killed: that folder is complete or absent;
4. a child restores the pre-erasure ``bk`` and is killed: every start refuses until
   the restore is run again; afterwards A stays erased (0 canaries in every read
   path and store) and B is intact, and the audit log verifies.

    python -m benchmarks.keys_reliability --runs 20 --backend sqlite --backend postgres

writes ``docs/bench/keys-reliability.json``; ``tests/reliability/test_keys_crash.py``
runs one short round per backend.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.reliability import (
    PLANNER,
    REPO,
    START_TIMEOUT_S,
    Target,
    grant_all,
    interaction,
    kernel_on,
    line_within,
    make_settings,
    temp_target,
)

DEFAULT_OUT = REPO / "docs" / "bench" / "keys-reliability.json"


def canaries(tag: str) -> list[str]:
    return [f"Qzk{tag}town", f"Qzk{tag}friend", f"Qzk{tag}note"]


def _fill(kernel: Any, subject: str, terms: list[str]) -> None:
    grant_all(kernel, subject)
    kernel.capture_many(
        subject,
        [
            interaction(f"I live in {terms[0]}"),
            interaction(f"Yesterday I met {terms[1]} at the market"),
            interaction(f"note {terms[2]}"),
        ],
    )
    kernel.process()


# ------------------------------------------------------------------- children


def _child(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["erase", "backup", "restore"])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--database-url", default=None)
    p.add_argument("--subject", default="")
    p.add_argument("--path", default="")
    args = p.parse_args(argv)
    target = Target(
        "postgres" if args.database_url else "sqlite", Path(args.data_dir), args.database_url
    )
    if args.mode == "erase":
        with kernel_on(target) as kernel:
            print("READY", flush=True)
            kernel.erase_subject(args.subject)
            print("ERASED", flush=True)
        return 0
    from uprof.services.backup import backup, restore

    settings = make_settings(target)
    print("READY", flush=True)
    if args.mode == "backup":
        backup(settings, Path(args.path))
    else:
        restore(settings, Path(args.path))
    print("DONE", flush=True)
    return 0


def child_args(target: Target, mode: str, **kw: str) -> list[str]:
    """The arguments of ``_child`` (after ``--child``) for a victim on ``target``."""
    args = [mode, "--data-dir", str(target.data_dir)]
    if target.database_url:
        args += ["--database-url", target.database_url]
    for key, value in kw.items():
        args += [f"--{key}", value]
    return args


#: Starts a victim: ``_child``'s arguments to a ``Popen``-like process, leader of a new
#: process group (its pg_dump / pg_restore die with it), whose ``stdout`` is read line by
#: line as the child writes it.
Spawn = Callable[[list[str]], Any]


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.keys_reliability", "--child", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: pg_dump / pg_restore die with it
    )


def _run_child(target: Target, mode: str, delay: float, spawn: Spawn, **kw: str) -> list[str]:
    proc = spawn(child_args(target, mode, **kw))
    assert proc.stdout is not None

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    first = line_within(proc.stdout, START_TIMEOUT_S, kill_group)
    if first is None or first.strip() != "READY":
        kill_group()
        _, err = proc.communicate()
        said = f"nothing within {START_TIMEOUT_S:.0f} s" if first is None else repr(first)
        raise RuntimeError(f"child {mode} did not start: {said} {err[-2000:]}")
    time.sleep(delay)
    kill_group()
    out, err = proc.communicate()
    if proc.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"child {mode} failed: {err[-2000:]}")
    return [line.strip() for line in out.splitlines(keepends=True) if line.endswith("\n")]


# ------------------------------------------------------------------- checks


def _erased_everywhere(kernel: Any, subject: str, terms: list[str]) -> list[str]:
    """Problems found: a read path that serves the subject, or a canary in any store."""
    from domain.errors import SubjectErasedError

    problems = []
    reads: dict[str, Callable[[], object]] = {
        "profile": lambda: kernel.profile(subject),
        "export": lambda: kernel.export_subject(subject),
        "slice": lambda: kernel.slice(
            subject,
            "where",
            budget_tokens=200,
            purpose="personalization",
            app_id=PLANNER,
            agent_id="agent:one",
        ),
        "capture": lambda: kernel.capture(subject, interaction("again")),
    }
    for name, read in reads.items():
        try:
            read()
            problems.append(f"{name} served the erased subject")
        except SubjectErasedError:
            pass
    report = kernel.residue_scan(terms)
    problems += [f"residue {f.kind} at {f.location}" for f in report.findings]
    return problems


def _intact(kernel: Any, subject: str, terms: list[str]) -> list[str]:
    try:
        export = json.dumps(kernel.export_subject(subject))
    except Exception as e:
        return [f"{subject} unreadable: {type(e).__name__}: {e}"]
    return [f"{subject} lost {t}" for t in terms if t not in export]


def keys_crash_scenario(
    target: Target, *, runs: int, seed: int = 7, spawn: Spawn = _spawn
) -> dict[str, Any]:
    """``spawn`` starts each victim (default: ``python -m benchmarks.keys_reliability
    --child``; the tests fork it from a process that has the project imported already)."""
    from domain.errors import SubjectErasedError
    from uprof.bootstrap import RestoreInterruptedError
    from uprof.services.backup import read_manifest, restore

    rng = random.Random(seed)
    settings = make_settings(target)
    backups = target.data_dir.parent / "backups"
    backups.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {
        "backend": target.kind,
        "runs": runs,
        "erase_acked": 0,
        "erase_finished_by_retry": 0,
        "erase_done_answer_lost": 0,
        "backup_complete": 0,
        "backup_absent": 0,
        "restore_interrupted": 0,
        "restore_completed_by_child": 0,
        "starts_refused_while_interrupted": 0,
        "violations": [],
    }
    violations: list[str] = figures["violations"]
    for run in range(runs):
        a, b = f"a{run}", f"b{run}"
        ta, tb = canaries(f"a{run}x"), canaries(f"b{run}x")
        with kernel_on(target) as kernel:
            _fill(kernel, a, ta)
            _fill(kernel, b, tb)
        from uprof.services.backup import backup

        backup(settings, backups / f"bk{run}")
        # 2. erasure, killed
        lines = _run_child(target, "erase", rng.uniform(0.0, 1.2), spawn, subject=a)
        acked = "ERASED" in lines
        figures["erase_acked"] += acked
        with kernel_on(target) as kernel:
            if acked:
                try:
                    kernel.profile(a)
                    violations.append(f"run {run}: acknowledged erasure of {a} undone")
                except SubjectErasedError:
                    pass
            else:
                # No answer: the caller asks again, as the residue audit's hint says. A
                # request killed after its ledger record reads as erased (its keys may be
                # gone) yet stays open, with no receipt, until asked again: the retry
                # finishes that same request. Only one that completed before the kill
                # (its answer lost) is refused as erased.
                try:
                    kernel.erase_subject(a)
                    figures["erase_finished_by_retry"] += 1
                except SubjectErasedError:
                    figures["erase_done_answer_lost"] += 1
            violations += [f"run {run} erase: {p}" for p in _erased_everywhere(kernel, a, ta)]
            violations += [f"run {run} erase: {p}" for p in _intact(kernel, b, tb)]
        # 3. backup, killed
        dest = backups / f"bk{run}-killed"
        _run_child(target, "backup", rng.uniform(0.0, 0.8), spawn, path=str(dest))
        if dest.exists():
            try:
                read_manifest(settings, dest)
                figures["backup_complete"] += 1
            except Exception as e:
                violations.append(f"run {run}: a killed backup left a broken folder: {e}")
        else:
            figures["backup_absent"] += 1
        # 4. restore of the pre-erasure backup, killed
        lines = _run_child(
            target, "restore", rng.uniform(0.0, 2.0), spawn, path=str(backups / f"bk{run}")
        )
        figures["restore_completed_by_child"] += "DONE" in lines
        try:
            with kernel_on(target):
                pass
        except RestoreInterruptedError:
            figures["starts_refused_while_interrupted"] += 1
            figures["restore_interrupted"] += 1
            restore(settings, backups / f"bk{run}")
        with kernel_on(target) as kernel:
            violations += [f"run {run} restore: {p}" for p in _erased_everywhere(kernel, a, ta)]
            violations += [f"run {run} restore: {p}" for p in _intact(kernel, b, tb)]
            try:
                kernel.audit_log.verify_integrity()
            except Exception as e:
                violations.append(f"run {run}: audit log does not verify: {e}")
    figures["violation_count"] = len(violations)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    p = argparse.ArgumentParser(prog="python -m benchmarks.keys_reliability", description=__doc__)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    for kind in args.backend or ["sqlite", "postgres"]:
        with temp_target(kind) as target:
            t0 = time.perf_counter()
            figures = keys_crash_scenario(target, runs=args.runs, seed=args.seed)
            figures["wall_s"] = round(time.perf_counter() - t0, 1)
        figures["command"] = (
            f"python -m benchmarks.keys_reliability --runs {args.runs} --backend {kind}"
        )
        results[kind] = figures
        print(json.dumps({kind: figures}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
