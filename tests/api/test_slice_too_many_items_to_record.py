"""A slice never holds more items than its read's audit entry can list, a read its audit
entry cannot record is refused before it is served, and every other read goes on being
served (review of 0138, bug HP; both backends).

Round 7 (bug HL) removed one input that passed a slice's checks and was then refused by
the read's audit entry, which stopped the read recorder, and with it every slice of every
app in the process until restart; it named the class as left. Another input reaches it
from any app's key, over REST too: the number of items. An audit entry lists at most
1,000 item references, and a slice's items are bounded by its budget only (32,768 tokens:
up to 200 memories plus every active attribute and intent that fits). A subject with a
thousand active intents (one a capture) and a slice asking the largest budget: served
with 1,099 items, its read record refused after the recorder's retries, and then every
slice of the process refused 503 ``read_not_recorded``. The packer now takes at most
``audit.entry.MAX_LIST`` items (the rest are left out, reason ``budget``, saying why), so
the slice is served and recorded; and the recorder checks every read's audit entry when it
is handed the read, before the slice is returned: a read it could not record is refused
(``InvalidInputError`` naming the field), nothing is recorded, the recorder stays healthy.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from audit.entry import MAX_LIST
from domain.errors import InvalidInputError
from domain.values import Interaction
from tests.api.conftest import CALENDAR, PLANNER, LiveServer, api_settings, bearer, build_kernel
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.services.reads import ServedRead

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


def _many_intents(kernel: Uprof, apps: tuple[str, ...]) -> None:
    for app in apps:
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


def test_a_slice_holds_no_more_items_than_an_audit_entry_lists(quiet_kernel: Uprof) -> None:
    kernel = quiet_kernel
    _many_intents(kernel, (PLANNER, CALENDAR))
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
        if budget == 32_768:  # more fit than the slice may hold: the rest are left out
            assert len(served.items) + len(served.left_out) > MAX_LIST
        return len(served.items)

    # The largest budget fits every item; the slice holds the audit entry's most.
    served = [read(PLANNER, 32_768), read(PLANNER, 2_000), read(CALENDAR, 2_000)]
    kernel.reads.drain()
    assert kernel.reads.healthy
    assert served[0] == MAX_LIST, served
    # (The calendar's policy lets it see none of these items: served empty, recorded.)
    assert 0 < served[1] < MAX_LIST, served
    assert kernel.reads.recorded == recorded + len(served)


def test_a_read_the_audit_log_cannot_record_is_refused_and_the_recorder_stays_healthy(
    quiet_kernel: Uprof,
) -> None:
    """Whatever reaches the recorder that its entry could not list (here more item refs
    than an entry holds, which the packer no longer produces) is refused alone."""
    kernel = quiet_kernel
    _many_intents(kernel, (PLANNER,))
    handle = kernel.subjects.find("alice")
    assert handle is not None
    recorded = kernel.reads.recorded
    too_many = ServedRead(
        stream_id=handle.stream_id,
        pseudonym=handle.pseudonym,
        app_id=PLANNER,
        agent_id="agent:one",
        purpose="personalization",
        item_ids=tuple(f"item-{n}" for n in range(MAX_LIST + 1)),
        served_at=kernel.clock.now(),
        budget_tokens=32_768,
        n_tokens=1,
    )
    with pytest.raises(InvalidInputError) as refused:
        kernel.reads.record(too_many)
    assert refused.value.field == "budget_tokens"
    assert str(MAX_LIST) in str(refused.value), str(refused.value)
    served = kernel.slice(
        "alice",
        "plans",
        budget_tokens=500,
        purpose="personalization",
        app_id=PLANNER,
        agent_id="agent:one",
        lexical_only=True,
    )
    kernel.reads.drain()
    assert served.items and kernel.reads.healthy
    assert kernel.reads.recorded == recorded + 1


def test_over_rest_the_largest_budget_is_served_with_the_most_items_an_entry_lists(
    quiet_kernel: Uprof, keys: ApiKeyStore
) -> None:
    """The same slice asked over REST by the app's key: 200 with the entry's most items;
    the next slice of the same key is served; the recorder stays healthy."""
    kernel = quiet_kernel
    _many_intents(kernel, (PLANNER,))
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
        largest = http.post("/v1/slices", json={**ask, "budget_tokens": 32_768})
        served = http.post("/v1/slices", json={**ask, "budget_tokens": 2_000})
    assert largest.status_code == 200, largest.text[:300]
    assert len(largest.json()["items"]) == MAX_LIST
    assert served.status_code == 200, served.text[:300]
    assert served.json()["items"]
    kernel.reads.drain()
    assert kernel.reads.healthy
