"""A check asked while holding a lock that every writer of every process waits for.

The audit log's write lock and the event store's own write lock are each waited for by
every write of uprof. A check asked under them (is the request's key still standing?)
may read another store; a store that does not answer then held every writer for as long
(bugs VQ, VR). ``asked_within`` gives such a check a bound and fails closed past it.

A check that did not answer is left to finish on its own thread (a thread cannot be
stopped). Two rules follow:

- The check changes nothing the caller or anyone else reads (it raises or returns): its
  answer may land after the caller refused the write and went on, e.g. after the
  capture writer's fallback wrote a request the late answer would have marked refused
  (bug VX). A check that must say more says it by what it raises.
- The checks left running are bounded (``MAX_CHECKS_LEFT_RUNNING``): behind a key store
  that hangs, each write refused past the bound left one thread waiting on it, one per
  write for as long as the store hung (bug VY). Past that many, the next check is
  refused at once, as an outage, without a thread and without holding the lock for the
  bound: the store has not answered that many reads already.

A write's key check asked in its writer turn, before the store's lock (the subject's turn
of ``EventStore.with_retry``; the capture writer's group, on the one thread that writes
every app's captures), is asked the same way, on threads named ``KEY_CHECK_IN_TURN``: it
had no bound, and a key read that hung there held the capture writer (bug WI). The
callers take the bound from ``uprof.recorders.key_check_within_s`` (the client's
``Prefer: wait``, bug WJ).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

from domain.errors import CheckUnansweredError

T = TypeVar("T")

#: How long a check may take under such a lock. The checks read one key row (about 1 ms
#: on PostgreSQL, p90 2.5 ms measured in 0227-leftovers-of-0218-to-0223); past this the
#: write is refused as in an outage, and the lock is let go.
CHECK_UNDER_LOCK_WITHIN_S = 2.0

#: Checks left running past their bound in this process (a thread each, waiting on the
#: store they read). Under the locks checks are asked one at a time per lock (two locks),
#: each answering in about a millisecond: this many left behind means the store they read
#: has hung. Checks under way within their bound do not count: the writer turns ask
#: theirs side by side, one per subject's turn (bug WI), and counted, the 17th of many
#: writes answering well within the bound was refused as an outage (bug XM).
MAX_CHECKS_LEFT_RUNNING = 16

#: The thread name of a check asked under one of the two locks (the default).
UNDER_A_LOCK = "check-under-lock"
#: The thread name of a write's key check asked in its writer turn, before the store's
#: lock: the subject's turn (``EventStore.with_retry``) or the capture writer's group.
KEY_CHECK_IN_TURN = "key-check-in-turn"

_guard = threading.Lock()
#: How many checks were left running past their bound and have not answered yet.
_left_running = 0


def asked_within(check: Callable[[], T], within_s: float, *, name: str = UNDER_A_LOCK) -> T:
    """Run ``check`` in this context's variables and return what it returns or raise what
    it raises; when it has not answered within ``within_s``, raise CheckUnansweredError
    (the caller writes nothing and lets its lock go) and leave the check to finish on its
    own thread (named ``name``), its answer unused. With ``MAX_CHECKS_LEFT_RUNNING``
    checks left running, refuse at once (module docstring)."""
    global _left_running
    with _guard:
        if _left_running >= MAX_CHECKS_LEFT_RUNNING:
            raise CheckUnansweredError(
                f"{MAX_CHECKS_LEFT_RUNNING} checks asked under a write lock are still "
                "waiting for the store they read; nothing was written"
            )
    context = contextvars.copy_context()
    answered: list[T] = []
    raised: list[BaseException] = []
    done = threading.Event()
    left_behind = [False]  # under _guard: counted in _left_running until it ends

    def run() -> None:
        global _left_running
        try:
            answered.append(context.run(check))
        except BaseException as error:  # handed to the caller below
            raised.append(error)
        finally:
            with _guard:
                done.set()
                if left_behind[0]:
                    _left_running -= 1

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(within_s):
        with _guard:
            if not done.is_set():  # it may have answered since: then nothing is left
                left_behind[0] = True
                _left_running += 1
        if left_behind[0]:
            raise CheckUnansweredError(
                f"a check asked under a write lock did not answer within {within_s:g} s; "
                "nothing was written"
            )
    if raised:
        raise raised[0]
    return answered[0]
