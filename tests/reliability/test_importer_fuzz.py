"""I12 for bad input: the JSONL importer raises only its two errors and never half-writes.

The REST API is fuzzed from its OpenAPI spec in tests/api/test_schemathesis.py.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.reliability import Target, grant_all, importer_fuzz, kernel_on
from domain.errors import ConsentRequiredError, InvalidInputError
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
@given(lines=st.lists(line, max_size=6))
def test_importer_raises_only_input_errors_and_never_half_writes(
    tmp_path_factory, lines: list[str]
) -> None:
    kernel = _kernel(tmp_path_factory)
    before = kernel.app.max_notification_id()
    try:
        report = import_interactions(kernel, lines)
    except (InvalidInputError, ConsentRequiredError):
        assert kernel.app.max_notification_id() == before, "a refused file wrote something"
        return
    assert kernel.app.max_notification_id() - before == report.captured


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
    assert r["outcomes"].get("imported", 0) > 0 and r["outcomes"].get("InvalidInputError", 0) > 0
