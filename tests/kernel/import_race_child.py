"""Child process for tests/kernel/test_import_beside_an_erasure.py: an import run by
another process (as `uprof import` would be), held before its first write of a subject
until the test has erased that subject."""

from __future__ import annotations

import json
from typing import Any

from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel
from uprof.services.importer import import_interactions
from uprof.settings import Settings


def lines_for(subjects: list[str], each: int) -> list[str]:
    """``each`` records per subject, interleaved (one write transaction per record)."""
    return [
        json.dumps(
            {
                "subject": subject,
                "app_id": APP,
                "agent_id": "agent:one",
                "user_input": f"{subject} note {i}",
                "occurred_at": "2025-01-01T09:00:00Z",
                "source_ref": f"{subject}:{i}",
            }
        )
        for i in range(each)
        for subject in subjects
    ]


def import_held_at(
    settings: Settings, held: str, lines: list[str], sync: dict[str, Any], out: Any
) -> None:
    """Import ``lines``; the second write naming ``held`` waits for ``sync["erased"]``
    (its first is in; the run's checks found the subject live and consented)."""
    kernel = build_kernel(settings, FakeClock())
    try:
        real = kernel.capture_once
        calls: list[str] = []

        def capture_once(subject: str, *args: Any, **kwargs: Any) -> Any:
            calls.append(subject)
            if calls.count(held) == 2 and subject == held:  # one of its records is in
                sync["ready"].set()
                assert sync["erased"].wait(timeout=120)
            return real(subject, *args, **kwargs)

        kernel.capture_once = capture_once  # type: ignore[method-assign]
        report = import_interactions(kernel, lines)
        out.put(
            (
                report.captured,
                report.skipped,
                [(p.where, p.field, p.message) for p in report.failed],
                report.stopped,
            )
        )
    finally:
        kernel.close()
