"""A keyed retry answered by one process is refused once another process revoked.

Two kernels on one store stand for two processes (``uprof serve`` and the CLI, or two
servers). The retry's first answer is stored in the shared idempotency table; a revocation
committed by the other process reaches the retry as it reaches a fresh call: the policy
(here without its refresh interval), a withdrawal and an erasure (read from the stream and
the erasure ledger) at once.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from domain.errors import ConsentRequiredError, PermissionDeniedError, SubjectErasedError
from domain.principal import Principal, PrincipalKind
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, say, settings_for
from uprof.facade import Facade
from uprof.kernel import Uprof

CLI = "operator:local#cli"


def keyed_capture(kernel: Uprof, key: str) -> Any:
    door = Facade(
        kernel, Principal(kernel.subjects.tenant, APP, "k1", PrincipalKind.APP, frozenset({"app"}))
    )
    interaction = say("I like green tea")
    return door.idempotent(
        key,
        "capture",
        {"text": "I like green tea"},
        lambda token: (asdict(door.capture("alice", interaction, request_token=token)), 201),
    )


@pytest.mark.parametrize("revocation", ["policy", "withdrawal", "erasure"])
def test_a_revocation_in_another_process_refuses_the_retry(
    backend: Backend, clock: FakeClock, revocation: str
) -> None:
    settings = settings_for(backend).model_copy(update={"policy_refresh_s": 0.0})
    serving = build_kernel(settings, clock)
    other = build_kernel(settings, clock)
    try:
        consent_id = consent(serving)
        assert not keyed_capture(serving, "k-1").replayed
        assert keyed_capture(serving, "k-1").replayed  # answered from the store
        if revocation == "policy":
            other.policy_revoke(requested_by=CLI, app_id=APP, role="role:assistant")
            refused: type[Exception] = PermissionDeniedError
        elif revocation == "withdrawal":
            other.withdraw_consent("alice", consent_id)
            refused = ConsentRequiredError
        else:
            other.erase_subject("alice")
            refused = SubjectErasedError
        with pytest.raises(refused):
            keyed_capture(serving, "k-1")
    finally:
        other.close()
        serving.close()
