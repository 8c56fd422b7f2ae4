"""Speed-ups must not change what a slice holds (decision 0041-slice-latency-round-2).

``slices_golden.json`` was written by the retrieval code before the round-2 latency
work (``python -m tests.retrieval.golden_slices``); every case is rebuilt here with
today's code and must match item for item, token for token, byte for byte.
"""

from __future__ import annotations

import json

import pytest

from tests.retrieval import golden_slices


@pytest.fixture(scope="module")
def today() -> dict[str, object]:
    return golden_slices.slices()


def test_every_case_of_the_golden_file_is_rebuilt(today: dict[str, object]) -> None:
    golden = json.loads(golden_slices.GOLDEN.read_text(encoding="utf-8"))
    assert sorted(today) == sorted(golden)
    assert len(golden) == 96


def test_slices_are_exactly_those_of_the_code_before_the_speed_ups(
    today: dict[str, object],
) -> None:
    golden = json.loads(golden_slices.GOLDEN.read_text(encoding="utf-8"))
    changed = [case for case in golden if today[case] != golden[case]]
    assert changed == [], f"{len(changed)} of {len(golden)} slices changed, e.g. {changed[:3]}"
