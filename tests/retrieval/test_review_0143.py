"""Review of 0143: the slice's item cap (``SliceOptions.max_items``, after bug HP) and the
left-out report (bug IG).

Every candidate of a slice is either served or left out with its reason: the left-out
report is what an app (and ``uprof explain``) sees of what the budget, duplicates and
relevance cut. Items the cap cut were in neither list.
"""

from __future__ import annotations

from tests.retrieval.factories import NOW, attribute, intent
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, PackedSlice, SliceOptions, build_slice

COUNTER = TiktokenCounter()


def _capped(max_items: int, budget: int = 4_000) -> tuple[PackedSlice, set[str]]:
    attrs = [attribute(f"a{i}", "preferences", f"likes hiking trail {i}") for i in range(6)]
    goals = [intent(f"i{i}", f"go hiking on trail {i}") for i in range(6)]
    packed = build_slice(
        query="hiking",
        attributes=attrs,
        intents=goals,
        memory_index=MemoryIndex.build([], None, COUNTER),
        budget_tokens=budget,
        counter=COUNTER,
        query_vector=None,
        now=NOW,
        options=SliceOptions(max_items=max_items),
    )
    return packed, {c.item_id for c in attrs + goals}


def test_items_the_cap_cut_are_left_out_with_the_reason() -> None:
    uncapped, every = _capped(max_items=1_000)
    assert {c.item_id for c in uncapped.items} == every  # the budget fits them all
    packed, every = _capped(max_items=5)
    shown = {c.item_id for c in packed.items}
    dropped = {lo.item_id: lo for lo in packed.left_out}
    assert len(shown) == 5
    assert shown.isdisjoint(dropped)
    assert shown | set(dropped) == every, sorted(every - shown - set(dropped))
    for item_id in every - shown:
        assert dropped[item_id].reason == "budget"
        assert "at most 5 items" in dropped[item_id].detail
