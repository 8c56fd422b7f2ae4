"""A read its audit entry cannot record is refused before it is served, and every other
read goes on being served (review of 0138, bug HP; both backends).

Round 7 (bug HL) removed one input that passed a slice's checks and was then refused by
the read's audit entry, which stopped the read recorder, and with it every slice of every
app in the process until restart; it named the class as left. Another input reaches it
from any app's key, over REST too: the number of items. An audit entry lists at most
1,000 item references, and a slice's items are bounded by its budget only (32,768 tokens:
up to 200 memories plus every active attribute and intent that fits). A subject with a
thousand active intents (one a capture) and a slice asking the largest budget: served
with 1,099 items, its read record refused after the recorder's retries, and then every
slice of the process refused 503 ``read_not_recorded``. The recorder now checks a read's
audit entry when it is handed the read, before the slice is returned: the read is refused
(422 naming ``budget_tokens``), nothing is recorded, and the recorder stays healthy.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from domain.errors import InvalidInputError
from domain.values import Interaction
from tests.api.conftest import CALENDAR, PLANNER, LiveServer, api_settings, bearer, build_kernel
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server

#: Active intents of the subject: with its 200 memories, more than an entry can list.
INTENTS = 1_200
WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


def _word(n: int) -> str:
    """A distinct word of letters only (the test extractor's intents are letters)."""
    return "".join(chr(97 + (n // 26**j) % 26) for j in range(3))


@pytest.fixture
def quiet_kernel(backend: Backend) -> Iterator[Uprof]:
    kernel = build_kernel(api_settings(backend, background=False))
    try:
        yield kernel
    finally:
        kernel.close()


def test_a_slice_with_more_items_than_an_audit_entry_lists_is_refused_alone(
    quiet_kernel: Uprof,
) -> None:
    kernel = quiet_kernel
    for app in (PLANNER, CALENDAR):
        kernel.grant_consent("alice", app_id=app, categories=["*"], purposes=["personalization"])
    said = [
        Interaction(
            app_id=PLANNER,
            agent_id="agent:one",
            occurred_at=WHEN,
            user_input=f"I want to go {_word(n)}",
            sharing="shared",
        )
        for n in range(INTENTS)
    ]
    for start in range(0, INTENTS, 100):
        kernel.capture_many("alice", said[start : start + 100])
    kernel.process()
    recorded = kernel.reads.recorded

    def read(app: str, budget: int) -> int:
        served = kernel.slice(
            "alice",
            "plans",
            budget_tokens=budget,
            purpose="personalization",
            app_id=app,
            agent_id="agent:one",
            lexical_only=True,
        )
        return len(served.items)

    with pytest.raises(InvalidInputError) as refused:
        read(PLANNER, 32_768)
    assert refused.value.field == "budget_tokens"
    assert "1000" in str(refused.value) or "1,000" in str(refused.value), str(refused.value)

    # Nothing of the refused read is recorded; every other read is served and recorded.
    served = [read(PLANNER, 2_000), read(CALENDAR, 2_000), read(PLANNER, 500)]
    kernel.reads.drain()
    assert kernel.reads.healthy
    # (The calendar's policy lets it see none of these items: served empty, recorded.)
    assert served[0] > 0 and served[2] > 0 and max(served) <= 1_000, served
    assert kernel.reads.recorded == recorded + len(served)


def test_over_rest_the_refusal_is_a_422_naming_the_budget(
    quiet_kernel: Uprof, keys: ApiKeyStore
) -> None:
    """The same slice asked over REST by the app's key: 422 ``invalid_input`` naming
    ``budget_tokens``; the next slice of the same key is served."""
    kernel = quiet_kernel
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    said = [
        Interaction(
            app_id=PLANNER,
            agent_id="agent:one",
            occurred_at=WHEN,
            user_input=f"I want to go {_word(n)}",
            sharing="shared",
        )
        for n in range(INTENTS)
    ]
    for start in range(0, INTENTS, 100):
        kernel.capture_many("alice", said[start : start + 100])
    kernel.process()
    planner = keys.create(PLANNER).token
    ask = {
        "subject": "alice",
        "query": "plans",
        "purpose": "personalization",
        "agent_id": "agent:one",
        "lexical_only": True,
    }
    with (
        LiveServer(create_server(kernel, keys)) as live,
        httpx.Client(base_url=live.url, timeout=60, headers=bearer(planner)) as http,
    ):
        refused = http.post("/v1/slices", json={**ask, "budget_tokens": 32_768})
        served = http.post("/v1/slices", json={**ask, "budget_tokens": 2_000})
    assert refused.status_code == 422, refused.text[:300]
    error = refused.json()["error"]
    assert error["code"] == "invalid_input"
    assert [f["field"] for f in error["fields"]] == ["budget_tokens"], error
    assert served.status_code == 200, served.text[:300]
    assert served.json()["items"]
    kernel.reads.drain()
    assert kernel.reads.healthy
