"""0210-sdk-polish's fast ``_Brackets`` attacked against the kept oracle (QY's follower,
``tests/api/test_sdk_brackets_equivalence.py``) with ``hypothesis``: texts made of the
characters the follower decides on, cut anywhere (empty pieces, one character each),
escapes and ``\\uXXXX`` escapes split across pieces, runs of ``\\\\"``, and the nesting
bound at a piece's end (0212-review-of-0208-to-0210). Each piece's verdict and whether
the object closed must be the same."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_sdk_brackets_equivalence import _judged, _Oracle
from uprof.sdk._client import _MAX_NESTING, _Brackets

#: The characters the follower decides on, blanks, a raw control character, text, and the
#: pieces of escapes (``\\u00e9``, ``\\\\"``) that a cut may split.
_ATOMS = st.sampled_from(
    [
        "{",
        "}",
        "[",
        "]",
        '"',
        "\\",
        " ",
        "\n",
        "\x01",
        "a",
        "é",
        ":",
        ",",
        "\\u00e9",
        '\\\\"',
        '\\"',
    ]
)
_TEXTS = st.lists(_ATOMS, max_size=60).map("".join)


def _cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted(c % (len(text) + 1) for c in cuts)
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def _alike(pieces: list[str]) -> None:
    assert _judged(_Brackets(), pieces) == _judged(_Oracle(), pieces), pieces


_SETTINGS = settings(
    max_examples=500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@given(text=_TEXTS, cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_held_any_text_cut_anywhere_is_judged_as_the_oracle_judges_it(
    text: str, cuts: list[int]
) -> None:
    _alike(_cut("{" + text, cuts))
    _alike(_cut(text, cuts))


@_SETTINGS
@given(text=_TEXTS)
def test_held_a_text_one_character_a_piece_with_empty_pieces_between(text: str) -> None:
    document = "{" + text
    _alike([piece for char in document for piece in (char, "")])


@_SETTINGS
@given(
    value=st.recursive(
        st.text(alphabet='ab{}[]"\\\n\té\u2028', max_size=6) | st.integers() | st.none(),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(alphabet='k{"\\', max_size=3), inner, max_size=3)
        ),
        max_leaves=12,
    ),
    ascii_only=st.booleans(),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_held_real_documents_with_escapes_cut_anywhere(
    value: object, ascii_only: bool, cuts: list[int]
) -> None:
    """``ensure_ascii`` writes ``\\u00e9`` escapes, which a cut splits anywhere."""
    text = json.dumps({"x": value}, ensure_ascii=ascii_only)
    _alike(_cut(text, cuts))


def test_held_the_nesting_bound_at_every_cut_near_it() -> None:
    """1,000 levels and one more, cut at each place around the deepest bracket, with a
    string holding brackets at the bottom."""
    for depth in (_MAX_NESTING, _MAX_NESTING + 1):
        text = "{" * depth + '"]}{\\""' + "}" * depth
        for at in range(depth - 3, depth + 9):
            _alike([text[:at], "", text[at:]])
