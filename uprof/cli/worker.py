"""``uprof worker``: run extraction and projections as a process of its own.

Any number of these (and of servers with their built-in worker) may run on one
database: every batch is saved only from the position it started at, so a batch
that another process saved first is re-read, never applied twice. With
``--partitions M --partition K`` a worker runs only the subjects of partition K
(``stream_id % M == K``), each partition with its own positions, so M workers share
the work instead of racing for it. SIGTERM or SIGINT: the batch in hand is
finished, then the process exits 0.
"""

from __future__ import annotations

import faulthandler
import io
import logging
import os
import select
import signal
import sys
import time
from types import FrameType
from typing import Annotated, Protocol

import typer

from domain.errors import UprofError
from uprof.backends.damage import log_fault_or_damage
from uprof.cli.context import CheckedTyper, console, fail, settings

_log = logging.getLogger("uprof.worker")


class Stop(Protocol):
    """What the loop needs of its stop flag (``threading.Event`` has it too)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class SignalledStop:
    """A stop flag that a signal handler may set: it takes no lock.

    A Python signal handler runs in the main thread between two bytecodes, possibly
    while that thread holds the lock inside ``threading.Event.wait``. ``Event.set()``
    from the handler then waits for a lock its own thread holds, forever: a worker that
    never stopped on SIGTERM, seen in the test suite. Here ``set`` only assigns a flag
    and writes a byte to a pipe (no lock), and ``wait`` sleeps in ``select`` on that
    pipe, which the byte wakes at once, even if it was written just before the sleep.
    """

    def __init__(self) -> None:
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._set = False

    def set(self) -> None:
        self._set = True
        try:
            os.write(self._wake_write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already: wait() returns at once anyway

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if not self._set:
            select.select([self._wake_read], [], [], timeout)
        return self._set


def run_loop(kernel: object, stop: Stop, *, idle_poll_s: float) -> dict[str, int]:
    """Process batches until ``stop`` is set; a failure is logged and retried with back-off."""
    from uprof import retry
    from uprof.kernel import Uprof

    assert isinstance(kernel, Uprof)
    totals = {"batches": 0, "processed": 0, "failures": 0}
    failed_in_a_row = 0
    while not stop.is_set():
        try:
            processed = kernel.process_once()
        except Exception as error:
            failed_in_a_row += 1
            backoff = retry.SUPERVISOR_BACKOFF.bound_s(failed_in_a_row)
            log_fault_or_damage(_log, error, "worker batch failed; retrying in %.1f s", backoff)
            totals["failures"] += 1
            stop.wait(backoff)
            continue
        failed_in_a_row = 0
        totals["batches"] += 1
        totals["processed"] += processed
        if processed == 0:
            stop.wait(idle_poll_s)
    return totals


def _stacks_on_sigusr1() -> None:
    """SIGUSR1 writes every thread's stack to stderr and the worker goes on: how an
    operator (or a test) asks a worker that does not stop where it is waiting."""
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        # stderr is not a file (run inside another program, as tests do): no dump there.
        _log.debug("stderr has no file descriptor; SIGUSR1 stack dumps are off")


def worker(
    partitions: Annotated[
        int | None,
        typer.Option(
            help="Partition count of this database (UPROF_WORKER_PARTITIONS; every server "
            "and worker on it must use the same)."
        ),
    ] = None,
    partition: Annotated[
        int | None, typer.Option(help="The partition this worker runs, 0..M-1 (default: all).")
    ] = None,
    idle_poll: Annotated[
        float, typer.Option(help="Seconds between polls of the log when caught up.")
    ] = 0.05,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
) -> None:
    """Run extraction and projections until SIGTERM (then finish the batch and exit 0)."""
    from uprof.backends import SchemaLockWaitStopped, stop_schema_lock_waits
    from uprof.bootstrap import bootstrap
    from uprof.logs import configure_process_logging
    from uprof.native_memory import limit_malloc_arenas

    overrides: dict[str, object] = {}
    if partitions is not None:
        overrides["worker_partitions"] = partitions
    try:
        worker_settings = settings().model_copy(update=overrides)
        worker_settings = type(worker_settings).model_validate(worker_settings.model_dump())
    except ValueError as e:
        console.print(f"[bold red]error:[/] {e}")
        raise typer.Exit(2) from None
    configure_process_logging(log_level, worker_settings.log_format)
    count = worker_settings.worker_partitions
    if partition is not None and not 0 <= partition < count:
        console.print(
            f"[bold red]error:[/] --partition must be in 0..{count - 1} (--partitions {count})"
        )
        raise typer.Exit(2)
    # Before any thread starts (the model's, the embedding read-ahead's).
    limit_malloc_arenas(worker_settings.malloc_arenas)
    stop = SignalledStop()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()  # no lock: see SignalledStop
        stop_schema_lock_waits()  # a start still waiting for a schema lock ends (bug NM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _stacks_on_sigusr1()
    try:
        kernel = bootstrap(worker_settings, partitions=None if partition is None else [partition])
    except SchemaLockWaitStopped as e:
        # Stopped as asked, before it started: a clean stop, as after a batch.
        print(f"uprof worker stopped before it started: {e}", file=sys.stderr, flush=True)
        return
    except UprofError as e:
        fail(e)
        return
    which = "all partitions" if partition is None else f"partition {partition}"
    # Plain print, flushed: scripts and tests wait for this line.
    print(f"uprof worker ready: {which} of {count}", flush=True)
    started = time.monotonic()
    try:
        totals = run_loop(kernel, stop, idle_poll_s=idle_poll)
    finally:
        kernel.close()
    print(
        f"uprof worker stopped: {totals['processed']} notifications in {totals['batches']} "
        f"batches, {totals['failures']} failures, {time.monotonic() - started:.1f} s",
        flush=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``worker`` to the main CLI."""
    app.command("worker")(worker)


def main() -> None:
    """``python -m uprof.cli.worker``: the same command without importing the whole CLI
    (its start-up is a third of a busy machine's, which the reliability bench pays often)."""
    app = CheckedTyper(add_completion=False)
    app.command()(worker)
    app()


if __name__ == "__main__":
    main()
