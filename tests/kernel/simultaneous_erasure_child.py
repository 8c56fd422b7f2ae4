"""A child process erasing while another erases the same subject (decision
0131-simultaneous-erasure-receipts): it builds its own kernel on the test's stores, as
another server or CLI process would, and stops at one step of the erasure until told.

``holds``, the steps to stop at, in the order the erasure reaches them:

- ``"after-lookup"``: the erasure has found the subject live (its own lookup), nothing
  recorded yet;
- ``"after-requested"``: its ``erasure.requested`` entry is on the log;
- ``"after-tombstone"``: its tombstone append returned (the position, or 0 when the
  stream already ended with one);
- ``"before-destroy"``: its ledger record is written, the keys not yet destroyed;
- ``"before-capture-preview"``: an event erasure has appended its ``CaptureErased``
  event and is about to look for the capture keys (nothing in the ledger yet);
- ``"before-capture-destroy"``: an event erasure's ledger record is written, its
  capture keys not yet destroyed (the test may kill it there);
- ``"after-destroy"``: its ``destroy`` returned (the keys deleted, committed), its
  ``key.destroyed`` entries not yet written (the test may kill it there);

Once its kernel is built it sets ``sync["built"]`` and waits for ``sync["begin"]``: a
process starting after another's erasure has written its ledger record re-applies that
record at start, destroying the keys itself, so the test builds every racer first. At
its i-th stop it sets ``sync[f"held{i}"]`` and waits for ``sync[f"go{i}"]``; its answer goes to
``out``: ``("ok", receipt)`` or ``("error", "<class>: <message>")``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from uprof.settings import Settings


def _stop(sync: dict[str, Any], i: int) -> None:
    sync[f"held{i}"].set()
    assert sync[f"go{i}"].wait(timeout=120), "the test never let the held erasure go on"


def erase_held(
    settings: Settings,
    holds: tuple[str, ...],
    sync: dict[str, Any],
    out: Any,
    call: Callable[[Any], Any] | None = None,
) -> None:
    kernel = build_kernel(settings, FakeClock())
    sync["built"].set()
    assert sync["begin"].wait(timeout=120), "the test never let the erasure begin"
    service = kernel.erasure_service
    stopped: list[str] = []

    def once(hold: str) -> None:
        if hold not in stopped:
            stopped.append(hold)
            _stop(sync, holds.index(hold))

    unknown = set(holds) - {
        "after-lookup",
        "after-requested",
        "after-tombstone",
        "before-destroy",
        "before-capture-preview",
        "after-destroy",
        "before-capture-destroy",
    }
    if unknown:
        raise ValueError(f"unknown holds {sorted(unknown)}")

    if "after-lookup" in holds:
        require = service._require

        def found_live(ref: str) -> Any:
            handle = require(ref)
            once("after-lookup")
            return handle

        service._require = found_live  # type: ignore[method-assign]
    if "after-requested" in holds:
        record = service._audit.record

        def recorded(action: str, **fields: Any) -> Any:
            written = record(action, **fields)
            if action == "erasure.requested":
                once("after-requested")
            return written

        service._audit.record = recorded  # type: ignore[method-assign]
    if "after-tombstone" in holds:
        append = service._app.append_subject_tombstone

        def appended(*args: Any, **kwargs: Any) -> int:
            position = append(*args, **kwargs)
            once("after-tombstone")
            return position

        service._app.append_subject_tombstone = appended  # type: ignore[method-assign]
    if "before-destroy" in holds:
        destroy = service._keystore.destroy

        def destroy_when_told(*args: Any, **kwargs: Any) -> Any:
            once("before-destroy")
            return destroy(*args, **kwargs)

        service._keystore.destroy = destroy_when_told  # type: ignore[method-assign]
    if "after-destroy" in holds:
        destroy_now = service._keystore.destroy

        def destroyed_then_held(*args: Any, **kwargs: Any) -> Any:
            destruction = destroy_now(*args, **kwargs)
            once("after-destroy")
            return destruction

        service._keystore.destroy = destroyed_then_held  # type: ignore[method-assign]
    if "before-capture-destroy" in holds:
        destroy_capture = service._keystore.destroy_capture_key

        def destroy_capture_when_told(*args: Any, **kwargs: Any) -> Any:
            once("before-capture-destroy")
            return destroy_capture(*args, **kwargs)

        service._keystore.destroy_capture_key = destroy_capture_when_told  # type: ignore[method-assign]
    if "before-capture-preview" in holds:
        preview = service._keystore.capture_key_commitment

        def preview_when_told(*args: Any, **kwargs: Any) -> Any:
            once("before-capture-preview")
            return preview(*args, **kwargs)

        service._keystore.capture_key_commitment = preview_when_told  # type: ignore[method-assign]
    try:
        result = call(kernel) if call is not None else kernel.erase_subject("alice")
        out.put(("ok", result.receipt))
    except Exception as error:  # reported to the test, which names it
        out.put(("error", f"{type(error).__name__}: {error}"[:500]))
    finally:
        kernel.close()


def erase_capture_of(capture_id: str, kernel: Any) -> Any:
    """``call`` for ``erase_held`` (with ``functools.partial``): erase one of alice's
    captured events."""
    return kernel.erase_capture("alice", capture_id)
