"""The one retry policy (uprof/retry.py): retries by error type only, bounded, typed give-up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from domain.errors import (
    ConcurrencyConflictError,
    PositionMovedError,
    StoreBusyError,
    VersionConflictError,
)
from uprof import retry
from uprof.retry import Backoff, RetryPolicy

REPO = Path(__file__).resolve().parents[2]


def _failing(errors: list[BaseException]) -> tuple[list[int], object]:
    calls: list[int] = []

    def operation() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "done"

    return calls, operation


def test_transient_errors_are_retried_until_the_operation_succeeds() -> None:
    calls, operation = _failing([VersionConflictError("lost"), VersionConflictError("lost")])
    lost: list[BaseException] = []
    policy = RetryPolicy(attempts=3, on=(VersionConflictError,))
    assert policy.call(operation, before_retry=lost.append) == "done"  # type: ignore[arg-type]
    assert len(calls) == 3
    assert [type(e) for e in lost] == [VersionConflictError, VersionConflictError]


def test_an_error_outside_the_policy_is_raised_at_once() -> None:
    calls, operation = _failing([StoreBusyError("busy")])
    policy = RetryPolicy(attempts=5, on=(VersionConflictError,))
    with pytest.raises(StoreBusyError):
        policy.call(operation)  # type: ignore[arg-type]
    assert len(calls) == 1


def test_the_attempts_are_bounded_and_give_up_names_the_last_error() -> None:
    calls, operation = _failing([PositionMovedError("p", 1, 2)] * 10)
    policy = RetryPolicy(attempts=4, on=(PositionMovedError,))
    with pytest.raises(ConcurrencyConflictError) as caught:
        policy.call(operation, give_up=lambda e: ConcurrencyConflictError("gave up"))  # type: ignore[arg-type]
    assert len(calls) == 4
    assert type(caught.value) is ConcurrencyConflictError
    assert isinstance(caught.value.__cause__, PositionMovedError)
    with pytest.raises(PositionMovedError):  # without give_up: the last error itself
        policy.call(_failing([PositionMovedError("p", 1, 2)] * 10)[1])  # type: ignore[arg-type]


def test_the_give_up_error_is_not_retried_by_an_outer_policy() -> None:
    """A nested policy that gave up raises the base error, which no policy lists."""
    inner = RetryPolicy(attempts=2, on=(VersionConflictError,))
    outer = RetryPolicy(attempts=3, on=(VersionConflictError, PositionMovedError))
    calls: list[int] = []

    def always_lost() -> None:
        calls.append(1)
        raise VersionConflictError("lost")

    def nested() -> None:
        inner.call(always_lost, give_up=lambda e: ConcurrencyConflictError("gave up"))

    with pytest.raises(ConcurrencyConflictError):
        outer.call(nested)
    assert len(calls) == 2


@pytest.mark.parametrize("retry_number", [1, 2, 3, 8, 20])
def test_backoff_doubles_up_to_its_cap_and_full_jitter_stays_below_it(retry_number: int) -> None:
    fixed = Backoff(0.005, 0.5)
    assert fixed.bound_s(retry_number) == min(0.5, 0.005 * 2 ** (retry_number - 1))
    jittered = Backoff(0.002, 0.1, jitter=True).tenacity_wait()

    class _State:
        attempt_number = retry_number

    waits = [jittered(_State()) for _ in range(200)]  # type: ignore[arg-type]
    assert all(0 <= w <= min(0.1, 0.002 * 2 ** (retry_number - 1)) for w in waits)
    assert NO_WAIT_IS_ZERO == Backoff().bound_s(retry_number)


NO_WAIT_IS_ZERO = 0.0


def test_the_policies_retry_only_transient_domain_errors() -> None:
    transient = (VersionConflictError, StoreBusyError, PositionMovedError)
    for name in ("SUBJECT_WRITE", "EXTRACTION_BATCH", "CAPTURE_GROUP", "POLICY_CHANGE"):
        policy = getattr(retry, name)
        assert policy.on and all(issubclass(t, transient) for t in policy.on), name
    assert retry.AUDIT_APPEND.on == (StoreBusyError, VersionConflictError)
    assert retry.WORKER_COLLISION.on == (PositionMovedError,)


def _sleeps_in_except_handlers(tree: ast.AST) -> list[int]:
    """Lines of ``time.sleep(...)`` inside an ``except`` handler (a hand-rolled retry)."""
    found = []
    for handler in ast.walk(tree):
        if isinstance(handler, ast.ExceptHandler):
            for node in ast.walk(handler):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "sleep"
                ):
                    found.append(node.lineno)
    return found


def _message_tests(tree: ast.AST) -> list[int]:
    """Lines that test a caught error's text: ``"..." in str(error)`` inside a handler."""
    found = []
    for handler in ast.walk(tree):
        if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
            continue
        for node in ast.walk(handler):
            if (
                isinstance(node, ast.Compare)
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
                and any(
                    isinstance(c, ast.Call)
                    and isinstance(c.func, ast.Name)
                    and c.func.id in {"str", "repr"}
                    and any(isinstance(a, ast.Name) and a.id == handler.name for a in c.args)
                    for c in node.comparators
                )
            ):
                found.append(node.lineno)
    return found


def test_no_product_code_retries_by_hand_or_classifies_errors_by_their_text() -> None:
    offenders = []
    for package in ("uprof", "domain", "projections", "policies", "audit", "benchmarks"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for line in _sleeps_in_except_handlers(tree) + _message_tests(tree):
                offenders.append(f"{path.relative_to(REPO)}:{line}")
    assert offenders == []


def test_the_checks_above_can_fail() -> None:
    hand_rolled = ast.parse(
        "for a in range(3):\n"
        "    try:\n        op()\n"
        "    except Exception as error:\n"
        "        if 'locked' in str(error):\n            time.sleep(0.1)\n"
    )
    assert _sleeps_in_except_handlers(hand_rolled) == [6]
    assert _message_tests(hand_rolled) == [5]


def test_a_told_wait_is_used_and_capped_at_the_backoffs_max() -> None:
    """``told_wait`` (a server's Retry-After, bug KE): the failure's own wait, never more
    than ``backoff.max_s``; the back-off's wait when the failure names none."""
    from tenacity import RetryCallState

    class Told(Exception):
        def __init__(self, wait_s: float | None) -> None:
            self.wait_s = wait_s

    policy = RetryPolicy(
        attempts=3,
        on=(Told,),
        backoff=Backoff(first_s=1.0, max_s=30.0),
        told_wait=lambda error: error.wait_s if isinstance(error, Told) else None,
    )

    def wait_after(error: BaseException) -> float:
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.set_exception((type(error), error, None))
        return float(policy._wait()(state))

    assert wait_after(Told(5.0)) == 5.0
    assert wait_after(Told(3600.0)) == 30.0
    assert wait_after(Told(-1.0)) == 0.0
    assert wait_after(Told(None)) == 1.0  # the back-off's first wait
