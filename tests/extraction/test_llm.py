"""The OpenAI-compatible extractor against a fake chat server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import UprofError
from domain.values import (
    ATTRIBUTE_KEYS,
    CATEGORIES,
    AttributeProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    MemoryProposal,
)
from tests.extraction.fake_openai import FakeOpenAI, Reply, chat, chat_json
from tests.extraction.helpers import TURN_TIME, capture, summarise
from uprof.adapters.extraction import (
    SYSTEM_PROMPT,
    ExtractionError,
    OpenAICompatibleExtractor,
    RuleBasedExtractor,
)

# Only loopback is reachable from these tests (enforced when pytest-socket is active).
pytestmark = pytest.mark.allow_hosts(["127.0.0.1"])

GOOD = {
    "attributes": [
        {"key": "home_location", "value": "Lisbon", "confidence": 0.9, "supersedes": True},
        {"key": "age", "value": 34, "confidence": 0.8, "explicit": True},
        {"key": "likes", "value": "jazz"},
    ],
    "intents": [
        {
            "description": "run a marathon",
            "category": "goal",
            "confidence": 0.7,
            "expires_at": "2025-07-01T00:00:00Z",
        }
    ],
    "intent_updates": [{"status": "fulfilled", "description": "read Dune"}],
    "memory": {"text": "I moved to Lisbon and want to run a marathon by June.", "importance": 0.8},
}


@pytest.fixture
def extractor(fake_llm: FakeOpenAI) -> Iterator[OpenAICompatibleExtractor]:
    with OpenAICompatibleExtractor(
        fake_llm.base_url, "llama3.1:8b", api_key="sk-test", timeout_s=2.0
    ) as ex:
        yield ex


def _turn(text: str = "I moved to Lisbon and I want to run a marathon by June", **kw: str):
    return capture(text, capture_id="cap-77", source_ref="turn-3", **kw)


def test_good_json_becomes_proposals_citing_the_capture(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(chat_json(GOOD))
    batch = extractor.extract(_turn())

    assert summarise(batch) == {
        "home_location=Lisbon!sup",
        "age=34",
        "likes=jazz",
        "intent:run a marathon@2025-07-01",
        "fulfilled:read Dune",
    }
    assert all(p.evidence == ("cap-77",) for p in batch.proposals)
    [memory] = [p for p in batch.proposals if isinstance(p, MemoryProposal)]
    assert memory.text.startswith("I moved to Lisbon")
    assert memory.importance == 0.8
    assert memory.source_refs == ("turn-3",)
    assert memory.occurred_at == TURN_TIME
    [intent] = [p for p in batch.proposals if isinstance(p, IntentProposal)]
    assert intent.expires_at == datetime(2025, 7, 1, tzinfo=UTC)
    assert batch.author == "llm/llama3.1:8b"
    assert batch.owner_agent == "agent-1" and batch.app_id == "app-1"
    assert batch.sharing == "shared:coach" and batch.purpose == "personalization"
    assert batch.extras["dropped"] == "0"
    assert "ignored_evidence" not in batch.extras


def test_request_is_an_openai_chat_completion(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(chat_json(GOOD))
    extractor.extract(_turn(agent_response="Great, Lisbon is lovely!"))

    [request] = fake_llm.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-test"
    body = request.body
    assert body["model"] == "llama3.1:8b"
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == 0.0
    system, user = body["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert "I moved to Lisbon" in user["content"]
    assert "Lisbon is lovely" in user["content"] and "context only" in user["content"]
    assert TURN_TIME.isoformat() in user["content"]
    # The model never sees the capture id, so it cannot echo or forge it.
    assert "cap-77" not in json.dumps(body)


def test_no_api_key_sends_no_authorization(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(chat_json({"attributes": []}))
    with OpenAICompatibleExtractor(fake_llm.base_url, "m", include_agent_reply=False) as ex:
        ex.extract(_turn(agent_response="SECRET REPLY"))
    [request] = fake_llm.requests
    assert "Authorization" not in request.headers
    assert "SECRET REPLY" not in json.dumps(request.body)


def test_code_fenced_json_is_accepted(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(
        chat('Here you go:\n```json\n{"attributes": [{"key": "diet", "value": "vegan"}]}\n```')
    )
    assert summarise(extractor.extract(_turn("I'm vegan"))) == {"diet=vegan"}


def test_malformed_json_raises_a_clear_error(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(chat('{"attributes": [{"key": "diet", "value": "vegan"'))
    with pytest.raises(ExtractionError, match="JSON object") as info:
        extractor.extract(_turn())
    assert isinstance(info.value, UprofError)
    assert info.value.retryable


def test_json_that_is_not_an_object_raises(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(chat('["vegan"]'))
    with pytest.raises(ExtractionError):
        extractor.extract(_turn())


def test_envelope_without_choices_raises(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(Reply(body=json.dumps({"choices": []})), Reply(body="<html>oops</html>"))
    with pytest.raises(ExtractionError, match="choices"):
        extractor.extract(_turn())
    with pytest.raises(ExtractionError, match="other than JSON"):
        extractor.extract(_turn())


def test_unknown_keys_categories_and_malformed_items_are_dropped_and_counted(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(
        chat_json(
            {
                "attributes": [
                    {"key": "shoe_size", "value": "44"},  # unknown key
                    {"key": "likes", "value": ["jazz", "blues"]},  # not a scalar
                    {"key": "likes", "value": "   "},  # empty
                    {"key": "dislikes", "value": "olives", "confidence": "high"},  # bad number
                    {"value": "Berlin"},  # no key
                    "Berlin",  # not an object
                    {"key": "likes", "value": "jazz", "confidence": 1.7},  # clamped
                    {"key": "dislikes", "value": "olives", "confidence": -0.2},  # clamped
                ],
                "intents": [
                    {"description": "read tarot", "category": "astrology"},  # unknown category
                    {"description": "learn Go", "expires_at": "next tuesday"},  # bad date
                    {"description": "learn Rust", "category": "goal"},
                ],
                "intent_updates": [
                    {"status": "expired", "description": "learn Go"},  # not the user's to say
                    {"status": "abandoned", "description": "learn the guitar"},
                ],
                "memory": {"text": ""},  # empty memory
                "mood": "happy",  # unknown top-level field: ignored, not an item
            }
        )
    )
    batch = extractor.extract(_turn())
    assert summarise(batch) == {
        "likes=jazz",
        "dislikes=olives",
        "intent:learn Rust",
        "abandoned:learn the guitar",
    }
    assert batch.extras["dropped"] == str(6 + 2 + 1 + 1)
    confidences = {
        p.value: p.confidence for p in batch.proposals if isinstance(p, AttributeProposal)
    }
    assert confidences == {"jazz": 1.0, "olives": 0.0}
    assert not [p for p in batch.proposals if isinstance(p, MemoryProposal)]


def test_a_field_of_the_wrong_type_counts_as_one_drop(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(chat_json({"attributes": {"key": "likes"}, "intents": None, "memory": 3}))
    batch = extractor.extract(_turn())
    assert batch.proposals == ()
    assert batch.extras["dropped"] == "2"


def test_injected_evidence_ids_are_ignored(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(
        chat_json(
            {
                "attributes": [
                    {"key": "name", "value": "Sam", "evidence": ["cap-OTHER-SUBJECT"]},
                    {"key": "age", "value": "34", "capture_id": "cap-forged"},
                ],
                "intents": [{"description": "visit Japan", "evidence_ids": ["cap-x", "cap-y"]}],
                "intent_updates": [
                    {"status": "fulfilled", "description": "read Dune", "intent_id": "int-9"}
                ],
                "memory": {"text": "I'm Sam.", "evidence": ["cap-z"]},
            }
        )
    )
    batch = extractor.extract(_turn())
    assert len(batch.proposals) == 5
    for p in batch.proposals:
        assert p.evidence == ("cap-77",)
    [update] = [p for p in batch.proposals if isinstance(p, IntentUpdateProposal)]
    assert update.intent_id == "" and update.status is IntentStatus.FULFILLED
    assert batch.extras["ignored_evidence"] == "4"
    assert batch.extras["dropped"] == "0"


def test_deadlines_in_the_past_or_without_zone_are_made_safe(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(
        chat_json(
            {
                "intents": [
                    {"description": "file taxes", "expires_at": "2020-04-15T00:00:00Z"},
                    {"description": "call mom", "expires_at": "2025-03-14T00:00:00"},
                ]
            }
        )
    )
    batch = extractor.extract(_turn())
    expiry = {p.description: p.expires_at for p in batch.proposals if isinstance(p, IntentProposal)}
    assert expiry == {"file taxes": None, "call mom": datetime(2025, 3, 14, tzinfo=UTC)}


def test_http_500_raises_a_retryable_error(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(Reply(status=500, body='{"error": "model crashed"}'))
    with pytest.raises(ExtractionError, match="HTTP 500") as info:
        extractor.extract(_turn())
    assert info.value.retryable
    assert "model crashed" in str(info.value)
    assert "sk-test" not in str(info.value)


def test_http_404_is_not_retryable(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(Reply(status=404, body='{"error": "model not found"}'))
    with pytest.raises(ExtractionError, match="HTTP 404") as info:
        extractor.extract(_turn())
    assert not info.value.retryable


def test_timeout_raises_promptly(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(body=json.dumps({"choices": []}), delay_s=10))
    with OpenAICompatibleExtractor(fake_llm.base_url, "m", timeout_s=0.3) as ex:
        start = time.perf_counter()
        with pytest.raises(ExtractionError, match=r"did not answer within 0\.3s") as info:
            ex.extract(_turn())
        assert time.perf_counter() - start < 5
    assert info.value.retryable


def test_unreachable_server_raises() -> None:
    # A port bound here and not listening refuses connections, and no other process can
    # listen on it while it is held (closed first, a parallel test's server could take it).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with OpenAICompatibleExtractor(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2) as ex:
            with pytest.raises(ExtractionError, match="could not reach"):
                ex.extract(_turn())


def test_fallback_is_used_when_the_model_fails(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(status=503, body="overloaded"))
    with OpenAICompatibleExtractor(
        fake_llm.base_url, "m", timeout_s=2, fallback=RuleBasedExtractor()
    ) as ex:
        batch = ex.extract(_turn("I'm vegan and I live in Porto"))
    assert summarise(batch) == {"diet=vegan", "home_location=Porto"}
    assert batch.author == "rules/v1"
    assert batch.extras["fallback_from"] == "llm/m"
    assert "HTTP 503" in batch.extras["fallback_reason"]
    assert all(p.evidence == ("cap-77",) for p in batch.proposals)


def test_empty_user_text_makes_no_call(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    batch = extractor.extract(_turn("   ", agent_response="I'm a doctor in Paris"))
    assert batch.proposals == ()
    assert fake_llm.requests == []


def test_shared_client_is_not_closed(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(chat_json({}), chat_json({}))
    with httpx.Client() as client:
        ex = OpenAICompatibleExtractor(fake_llm.base_url + "/", "m", client=client, timeout_s=2)
        ex.extract(_turn())
        ex.close()
        ex.extract(_turn())  # still usable: the caller owns the client
    assert len(fake_llm.requests) == 2
    assert fake_llm.requests[0].path == "/v1/chat/completions"  # trailing slash handled


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "localhost:11434", "model": "m"}, "base_url"),
        ({"base_url": "http://127.0.0.1:1/v1", "model": " "}, "model"),
        ({"base_url": "http://127.0.0.1:1/v1", "model": "m", "timeout_s": 0}, "timeout_s"),
    ],
)
def test_constructor_validates(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OpenAICompatibleExtractor(**kwargs)  # type: ignore[arg-type]


def test_long_memory_is_truncated(
    fake_llm: FakeOpenAI, extractor: OpenAICompatibleExtractor
) -> None:
    fake_llm.script(chat_json({"memory": {"text": "word " * 500, "importance": 0.4}}))
    [memory] = extractor.extract(_turn()).proposals
    assert isinstance(memory, MemoryProposal)
    assert len(memory.text) <= 600


def test_timeouts_leave_the_next_call_working(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        Reply(body="{}", delay_s=10), chat_json({"attributes": [{"key": "diet", "value": "vegan"}]})
    )
    with OpenAICompatibleExtractor(fake_llm.base_url, "m", timeout_s=0.3) as ex:
        with pytest.raises(ExtractionError):
            ex.extract(_turn())
        ex.timeout_s = 2.0
        assert summarise(ex.extract(_turn())) == {"diet=vegan"}


def test_turn_time_without_zone_keeps_naive_deadlines(fake_llm: FakeOpenAI) -> None:
    naive = TURN_TIME.replace(tzinfo=None)
    fake_llm.script(
        chat_json({"intents": [{"description": "call mom", "expires_at": "2025-03-14T00:00:00Z"}]})
    )
    with OpenAICompatibleExtractor(fake_llm.base_url, "m", timeout_s=2) as ex:
        batch = ex.extract(capture("I'll call mom", occurred_at=naive))
    # An aware deadline cannot be compared with a naive turn time: it is dropped, not guessed.
    [intent] = batch.proposals
    assert isinstance(intent, IntentProposal) and intent.expires_at is None


# Leaves mix junk with words the parser looks for, so some items are valid.
_words = st.sampled_from(
    [
        *ATTRIBUTE_KEYS,
        *("goal", "astrology", "fulfilled", "abandoned", "expired", "0.7", "x"),
        *("2025-07-01T00:00:00Z", "2020-01-01", "2025-03-13T10:00:00"),
    ]
)
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.floats(allow_nan=True)
    | st.integers()
    | st.text(max_size=20)
    | _words,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=25,
)
_item_keys = st.sampled_from(
    [
        "key",
        "value",
        "confidence",
        "explicit",
        "supersedes",
        "negated",
        "description",
        "category",
        "expires_at",
        "status",
        "text",
        "importance",
        "evidence",
    ]
)
_model_answers = st.fixed_dictionaries(
    {},
    optional={
        "attributes": st.lists(st.dictionaries(_item_keys, _json_values, max_size=7), max_size=4)
        | _json_values,
        "intents": st.lists(st.dictionaries(_item_keys, _json_values, max_size=5), max_size=3),
        "intent_updates": st.lists(st.dictionaries(_item_keys, _json_values), max_size=3),
        "memory": _json_values | st.dictionaries(_item_keys, _json_values, max_size=3),
    },
)


@settings(max_examples=200, deadline=None)
@given(answer=_model_answers | _json_values, as_text=st.booleans())
def test_any_model_answer_yields_a_clean_batch_or_an_extraction_error(
    answer: object, as_text: bool
) -> None:
    """Whatever the model says, the caller gets valid proposals citing the capture, or an error."""
    content = answer if as_text and isinstance(answer, str) else json.dumps(answer)

    def reply(request: httpx.Request) -> httpx.Response:
        envelope = {"choices": [{"message": {"role": "assistant", "content": content}}]}
        return httpx.Response(200, json=envelope)

    with httpx.Client(transport=httpx.MockTransport(reply)) as client:
        ex = OpenAICompatibleExtractor("http://model.invalid/v1", "m", client=client)
        try:
            batch = ex.extract(_turn())
        except ExtractionError:
            # Only an answer that is not a JSON object may be refused whole: inside an
            # object, bad items are dropped and counted, never a reason to lose the rest.
            assert not (isinstance(answer, dict) and content == json.dumps(answer))
            return
    assert int(batch.extras["dropped"]) >= 0
    for p in batch.proposals:
        assert p.evidence == ("cap-77",)
        if isinstance(p, AttributeProposal):
            assert p.key in ATTRIBUTE_KEYS and p.value.strip()
            assert 0.0 <= p.confidence <= 1.0
        elif isinstance(p, IntentProposal):
            assert p.category in CATEGORIES and 0.0 <= p.confidence <= 1.0
            assert p.expires_at is None or p.expires_at > TURN_TIME
        elif isinstance(p, IntentUpdateProposal):
            assert p.status in (IntentStatus.FULFILLED, IntentStatus.ABANDONED)
        else:
            assert isinstance(p, MemoryProposal) and 0.0 <= p.importance <= 1.0
