"""``_Brackets``, made fast (it skips text, whole strings and bracketed runs up to a
few levels deep in ``re``), judges every text as QY's follower did (0206-review-of-0204),
which stepped in Python at every bracket, quote and escape and is kept here as the oracle.

Random documents, then cut into random pieces and altered (a character dropped, doubled
or replaced by one of JSON's structural ones or a raw control character), are fed to
both: each piece's verdict and whether the object closed must be the same. Seeded, so a
failure comes back the same.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from uprof.sdk._client import _MAX_NESTING, _Brackets

_STRUCTURE = re.compile(r'[{}\[\]"\\]')
_CLOSES = {"}": "{", "]": "["}


class _Oracle:
    """QY's follower as it was merged (0206): one Python step per bracket, quote and
    escape."""

    def __init__(self) -> None:
        self._open: list[str] = []
        self._started = self._in_string = self._escaped = self.closed = False

    def feed(self, text: str) -> bool:
        if self.closed:
            return not text.strip()
        skip = -1
        if self._escaped and text:
            skip, self._escaped = 0, False
        for found in _STRUCTURE.finditer(text):
            at, char = found.start(), found.group()
            if at == skip:
                continue
            if not self._started:
                if char != "{" or text[:at].strip():
                    return False
                self._started = True
                self._open.append(char)
            elif self._in_string:
                if char == "\\":
                    skip = at + 1
                    self._escaped = skip == len(text)
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                if len(self._open) >= _MAX_NESTING:
                    return False
                self._open.append(char)
            elif char == "\\" or self._open.pop() != _CLOSES[char]:
                return False
            elif not self._open:
                self.closed = True
                return not text[at + 1 :].strip()
        return self._started or not text.strip()


#: Characters a string of the documents is made of: the structural ones come often.
_TEXT = 'ab {}[]"\\\n\t:,é'


def _value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(6 if depth < 6 else 3)
    if kind == 0:
        return "".join(rng.choice(_TEXT) for _ in range(rng.randrange(8)))
    if kind == 1:
        return rng.choice([0, -1.5, True, None, 12345])
    if kind == 2:
        return ""
    if kind == 3:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(4))}


def _altered(rng: random.Random, text: str) -> str:
    for _ in range(rng.randrange(4)):
        if not text:
            break
        at = rng.randrange(len(text))
        how = rng.randrange(3)
        if how == 0:
            text = text[:at] + text[at + 1 :]
        elif how == 1:
            text = text[:at] + text[at] + text[at:]
        else:
            text = text[:at] + rng.choice('{}[]"\\ x\x01\n') + text[at + 1 :]
    return text


def _pieces(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.randrange(len(text) + 1) for _ in range(rng.randrange(6)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _judged(follower: _Brackets | _Oracle, pieces: list[str]) -> tuple[list[bool], bool]:
    """Each piece's verdict up to the first refusal (after it the text is refused
    whatever comes), and whether the object closed."""
    verdicts = []
    for piece in pieces:
        verdicts.append(follower.feed(piece))
        if not verdicts[-1]:
            break
    return verdicts, follower.closed


def _document(rng: random.Random) -> str:
    text = json.dumps(_value(rng, 0) if rng.randrange(8) else {"x": _value(rng, 0)})
    if rng.randrange(3) == 0:
        text = json.dumps({"d": json.loads(text), "s": text})  # a document in a string
    if rng.randrange(4) == 0:
        text = rng.choice(["", " ", "\n"]) + text + rng.choice(["", " ", "}", " {}"])
    return text


@pytest.mark.parametrize("seed", range(8))
def test_held_the_fast_follower_judges_random_texts_as_the_old_one(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(1500):
        text = _document(rng)
        if rng.randrange(3):
            text = _altered(rng, text)
        pieces = _pieces(rng, text)
        assert _judged(_Brackets(), pieces) == _judged(_Oracle(), pieces), pieces


@pytest.mark.parametrize("depth", range(_MAX_NESTING - 4, _MAX_NESTING + 2))
@pytest.mark.parametrize("inner", ["", '"a{"', "[]", "{}", '["x]"]', "[{[]}]", '[[{"a": [1]}]]'])
def test_held_the_nesting_bound_is_where_it_was(depth: int, inner: str) -> None:
    """At ``_MAX_NESTING`` no bracket opens, in a bracketed run too (the fast follower
    skips such runs whole, a few levels at a time, below the bound)."""
    text = "{" * depth + inner + "}" * depth
    for at in (0, depth, len(text) // 2, len(text)):
        pieces = [text[:at], text[at:]]
        assert _judged(_Brackets(), pieces) == _judged(_Oracle(), pieces), (depth, inner, at)


def test_held_every_split_of_a_dense_answer_is_judged_alike() -> None:
    """Every cut of a short dense text (flat objects in a list, escapes at string ends)."""
    text = json.dumps({"l": [{"a": 'x\\"', "b": [1, "]"]}, {}, [], {"c": "\\\\"}]})
    for variant in (text, text[:-1], text + "}", text.replace("[1", "{1")):
        for at in range(len(variant) + 1):
            for also in (at, min(at + 3, len(variant))):
                pieces = [variant[:at], variant[at:also], variant[also:]]
                assert _judged(_Brackets(), pieces) == _judged(_Oracle(), pieces), pieces
