"""Review of decision 0112: ``uprof projections run`` (``Uprof.process_to_log_end``) runs
the late ``capture.accepted`` check even when there is nothing left to extract.

A CLI-only deployment (no server, no ``uprof worker``) has no other process to check
its captures: ``projections run`` is the pipeline. ``Uprof.process`` ran at least one
extraction pass, which ends with the check of what is due; ``process_to_log_end``
runs extraction only while a partition's position is behind the log's end. When the
log ends with the last capture (its extraction wrote nothing), a lost request extracted
by an earlier run within the grace was never checked by a later run: named by nobody.
Both backends.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.conftest import Backend
from tests.fakes.ports import FakeClock, FakeExtractor
from tests.kernel.conftest import consent, running, settings_for
from tests.kernel.test_capture_accepted_reconciled import LATE, accepted
from tests.kernel.test_late_check_durable import killed_after_commit
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.services.late_captures import LateCaptures


class _Nothing(FakeExtractor):
    """An extractor that finds nothing (chit-chat): extraction writes no event."""

    def extract(self, capture: Any) -> Any:
        return replace(super().extract(capture), proposals=())


def _cli_run(kernel: Uprof, *, later_s: float = 0) -> None:
    kernel.extraction._extractor = _Nothing()
    late = kernel.extraction.late_captures
    assert isinstance(late, LateCaptures)
    when = datetime.now(UTC) + timedelta(seconds=later_s)
    late._now = lambda: when  # type: ignore[method-assign]
    kernel.process_to_log_end()


def test_a_later_projections_run_checks_what_an_earlier_one_extracted(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)  # the default grace
    with running(settings, clock) as kernel:
        consent(kernel, "alice")
    killed_after_commit(backend, 1)  # alice's request: stored, its entry lost
    with running(settings, clock) as kernel:
        _cli_run(kernel)  # extracted; too young to check
        captures = kernel.app.notifications_after(0, 100, topics=(CAPTURED_TOPIC,))
        assert kernel.extraction.partition_position(0) == captures[-1].id
        assert kernel.app.max_notification_id() == captures[-1].id  # nothing after it
        assert accepted(kernel) == []
    with running(settings, clock) as kernel:  # the next `uprof projections run`
        _cli_run(kernel, later_s=120)
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 2}]
