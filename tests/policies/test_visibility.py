"""Visibility of shared agent memory (I4): private means the owner agent only."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import is_visible

# The documented grammar, restated here rather than taken from domain.values.
_WELL_FORMED = re.compile(r"private|shared|shared:[a-z0-9_.-]+(,[a-z0-9_.-]+)*")


def _expected(owner: str, raw: str | None, reader: str, reader_type: str) -> bool:
    """Return the visibility the invariant asks for, computed independently."""
    if not reader:
        return False
    if reader == owner:
        return True
    text = (raw or "").strip()
    if not _WELL_FORMED.fullmatch(text) or text == "private":
        return False
    if text == "shared":
        return True
    # Typed sharing reaches the owner app's own agents only (an app speaks for its agents).
    owner_app, reader_app = owner.partition("/"), reader.partition("/")
    same_app = bool(owner_app[1]) and bool(reader_app[1]) and owner_app[0] == reader_app[0]
    return same_app and reader_type in text.split(":", 1)[1].split(",")


@pytest.mark.parametrize(
    ("raw", "reader", "reader_type", "visible"),
    [
        ("private", "app:a/agent:owner", "planner", True),
        ("private", "app:b/agent:owner", "planner", False),  # another app's "agent:owner"
        ("shared", "app:b/agent:other", "anything", True),
        ("shared:planner,travel", "app:b/agent:other", "travel", False),  # type from app b
        ("shared:planner,travel", "agent:other", "travel", False),  # bare id: no app, no type
        ("private", "agent:other", "planner", False),
        (None, "agent:other", "planner", False),
        ("", "agent:other", "planner", False),
        ("shared", "agent:other", "anything", True),
        (" shared ", "agent:other", "anything", True),
        ("shared:planner,travel", "app:a/agent:other", "travel", True),
        ("shared:planner,travel", "app:a/agent:other", "shopping", False),
        ("shared:planner", "agent:other", "", False),
        ("Shared", "agent:other", "planner", False),
        ("shared:", "agent:other", "", False),
        ("shared:Planner", "agent:other", "Planner", False),
        ("shared;drop table", "agent:other", "planner", False),
        ("public", "agent:other", "planner", False),
        ("shared", "", "planner", False),
    ],
)
def test_visibility_examples(raw: str | None, reader: str, reader_type: str, visible: bool) -> None:
    assert is_visible("app:a/agent:owner", raw, reader, reader_type) is visible


def test_an_item_without_owner_is_not_visible_to_a_reader_without_id() -> None:
    assert not is_visible("", "private", "", "planner")


AGENTS = st.sampled_from(
    ["agent:a", "agent:b", "app:x/agent:a", "app:x/agent:b", "app:y/agent:a"]
) | st.text(max_size=8)
AGENT_TYPES = st.sampled_from(["planner", "travel", "shopping", ""]) | st.text(max_size=8)
SHARING = st.one_of(
    st.none(),
    st.sampled_from(["private", "shared", "shared:planner", "shared:planner,travel", ""]),
    st.sampled_from(["shared:", "Shared", "shared:Planner", "shared, planner", "private\nshared"]),
    st.text(max_size=30),
    st.from_regex(r"shared:[a-z]{1,8}(,[a-z]{1,8}){0,3}", fullmatch=True),
)


@given(owner=AGENTS, raw=SHARING, reader=AGENTS, reader_type=AGENT_TYPES)
def test_visibility_matches_the_invariant(
    owner: str, raw: str | None, reader: str, reader_type: str
) -> None:
    assert is_visible(owner, raw, reader, reader_type) is _expected(owner, raw, reader, reader_type)


@given(owner=AGENTS.filter(bool), raw=SHARING, reader_type=AGENT_TYPES)
def test_the_owner_always_sees_its_own_items(owner: str, raw: str | None, reader_type: str) -> None:
    assert is_visible(owner, raw, owner, reader_type)


ITEMS = st.lists(st.tuples(AGENTS, SHARING), min_size=1, max_size=30)
READERS = st.lists(st.tuples(AGENTS, AGENT_TYPES), min_size=1, max_size=6)


@given(items=ITEMS, readers=READERS)
def test_random_multi_agent_histories_leak_no_private_item(
    items: list[tuple[str, str | None]], readers: list[tuple[str, str]]
) -> None:
    leaks = 0
    for owner, raw in items:
        text = (raw or "").strip()
        private = text == "private" or not _WELL_FORMED.fullmatch(text)
        for reader, reader_type in readers:
            if private and reader != owner and is_visible(owner, raw, reader, reader_type):
                leaks += 1
    assert leaks == 0
