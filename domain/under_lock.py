"""A check asked while holding a lock that every writer of every process waits for.

The audit log's write lock and the event store's own write lock are each waited for by
every write of uprof. A check asked under them (is the request's key still standing?)
may read another store; a store that does not answer then held every writer for as long
(bugs VQ, VR). ``asked_within`` gives such a check a bound and fails closed past it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

from domain.errors import StoreUnavailableError

#: How long a check may take under such a lock. The checks read one key row (about 1 ms
#: on PostgreSQL, p90 2.5 ms measured in 0227-leftovers-of-0218-to-0223); past this the
#: write is refused as in an outage, and the lock is let go.
CHECK_UNDER_LOCK_WITHIN_S = 2.0


def asked_within(check: Callable[[], None], within_s: float) -> None:
    """Run ``check`` in this context's variables and raise what it raises; when it has
    not answered within ``within_s``, raise StoreUnavailableError (the caller writes
    nothing and lets its lock go) and leave the check to finish on its own thread, its
    answer unused: a thread cannot be stopped, and what the check guarded was refused."""
    context = contextvars.copy_context()
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def run() -> None:
        try:
            context.run(check)
            outcome.append(None)
        except BaseException as error:  # handed to the caller below
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=run, name="check-under-lock", daemon=True).start()
    if not done.wait(within_s):
        raise StoreUnavailableError(
            f"a check asked under a write lock did not answer within {within_s:g} s; "
            "nothing was written"
        )
    if outcome[0] is not None:
        raise outcome[0]
