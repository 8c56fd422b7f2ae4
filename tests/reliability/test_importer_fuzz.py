"""I12 for bad input: the importer never raises on a bad record, reports each one by line,
writes exactly the interactions it counts as captured, and in strict mode writes nothing
unless every record passes.

The REST API is fuzzed from its OpenAPI spec in tests/api/test_schemathesis.py.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.reliability import Target, grant_all, importer_fuzz, kernel_on
from uprof.services.importer import import_interactions

GOOD = {
    "subject": "alice",
    "app_id": "app:planner",
    "agent_id": "agent:one",
    "user_input": "I want to import things",
    "occurred_at": "2025-01-01T09:00:00Z",
}
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
    st.sampled_from(["bob", "nobody", "app:calendar", "2025-01-01T09:00:00", "shared", ""]),
)
rows = st.one_of(
    st.just(GOOD),
    st.builds(
        lambda base, edits: {**base, **edits},
        st.just(GOOD),
        st.dictionaries(
            st.sampled_from([*GOOD, "purpose", "sharing", "context", "agent_type", "x"]),
            values,
            max_size=3,
        ),
    ),
)
line = st.one_of(rows.map(lambda r: json.dumps(r)), st.text(max_size=60))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(lines=st.lists(line, max_size=6), strict=st.booleans())
def test_importer_reports_bad_records_and_writes_exactly_what_it_counts(
    tmp_path_factory, lines: list[str], strict: bool
) -> None:
    kernel = _kernel(tmp_path_factory)
    before = kernel.app.max_notification_id()
    report = import_interactions(kernel, lines, strict=strict)
    written = kernel.app.max_notification_id() - before
    records = sum(1 for raw in lines if raw.strip())
    assert report.lines == records
    assert len(report.failed) <= records
    assert len({p.where for p in report.failed}) == len(report.failed), "one report per record"
    assert all(p.where.startswith("line ") and p.field and p.message for p in report.failed)
    if strict and report.failed:
        assert report.refused and written == 0, "a strict run with a bad record wrote"
    else:
        assert written == report.captured, "the log grew by other than what was counted"
        assert report.captured + report.skipped + len(report.failed) >= records - len(report.failed)


_KERNELS: dict[str, object] = {}


def _kernel(tmp_path_factory):
    # One SQLite kernel for all examples (bootstrapping per example would dominate).
    if "k" not in _KERNELS:
        target = Target("sqlite", tmp_path_factory.mktemp("fuzz") / "data")
        ctx = kernel_on(target)
        kernel = ctx.__enter__()
        grant_all(kernel, "alice")
        _KERNELS["k"] = kernel
        _KERNELS["ctx"] = ctx
    return _KERNELS["k"]


def teardown_module() -> None:
    ctx = _KERNELS.pop("ctx", None)
    if ctx is not None:
        ctx.__exit__(None, None, None)
    _KERNELS.clear()


def test_seeded_importer_fuzz_on_both_backends(target: Target) -> None:
    r = importer_fuzz(target, examples=80)
    assert r["unexpected_exceptions"] == 0, r["unexpected_samples"]
    assert r["partial_writes"] == 0
    # The seeded files reach every outcome: clean, per-record failures, strict refusals.
    outcomes = r["outcomes"]
    assert outcomes.get("clean", 0) > 0 and outcomes.get("with_failed_records", 0) > 0
    assert outcomes.get("strict_refused", 0) > 0 and r["failed_records"] > 0
