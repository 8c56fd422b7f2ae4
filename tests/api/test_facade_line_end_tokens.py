"""An id with a trailing line end is bad input at the door, not the end of every slice
(hostile callers round 7, bug HL; both backends).

``check_token`` (``domain/values.py``) matched its pattern with ``$``, which in Python
also matches before a final ``\\n``: ``agent:one\\n`` passed the slice's checks of
``agent_id`` and ``purpose``. REST, MCP and the SDK never send one (their request models
check the same pattern in full), but the facade is also called in process (the CLI,
``uprof.facade.Facade`` embedded: docs/integrations.md). There the slice was served, and
its read record, whose audit entry checks tokens in full, was refused: the read recorder
gave up, and every later slice of every app in the process was refused
(``ReadRecordingError``, "slices are refused until restart"). The check now matches the
whole value, so the caller gets a 422-style error naming the field and nothing else is
touched.
"""

from __future__ import annotations

import pytest

from domain.errors import InvalidInputError
from domain.principal import Principal, PrincipalKind
from domain.values import check_token
from tests.api.conftest import PLANNER
from uprof.facade import Facade
from uprof.kernel import Uprof


def test_a_line_end_in_a_slices_ids_is_refused_naming_the_field(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    # The fixture's kernel runs no worker: projected here, the good slices below find
    # alice's views caught up instead of each waiting out read_wait_timeout_s (10 s).
    kernel.process()
    tenant = kernel.subjects.tenant
    door = Facade(kernel, Principal(tenant, PLANNER, "k1", PrincipalKind.APP, frozenset({"app"})))
    good = {"purpose": "personalization", "agent_id": "agent:one"}
    for field in ("agent_id", "purpose"):
        bad = {**good, field: good[field] + "\n"}
        with pytest.raises(InvalidInputError) as refused:
            door.slice("alice", "diet", budget_tokens=100, **bad)
        assert refused.value.field == field
    # Every other caller's slices are still served and recorded.
    served = door.slice("alice", "diet", budget_tokens=100, **good)
    assert served.subject_pseudonym
    kernel.reads.drain()  # the read is recorded
    assert kernel.reads.healthy
    served_again = door.slice("alice", "diet", budget_tokens=100, **good)
    assert served_again.subject_pseudonym


@pytest.mark.parametrize("value", ["a\n", "a\r", "a\n\n", "\n", "a b", ""])
def test_check_token_matches_the_whole_value(value: str) -> None:
    with pytest.raises(InvalidInputError):
        check_token("agent_id", value)
