"""``build_slice``: rank the three layers, pack them under the budget, render, verify."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import NamedTuple

import numpy as np

from domain.values import Layer
from uprof import telemetry
from uprof.ports import TokenCounter
from uprof.retrieval import render
from uprof.retrieval.candidates import Candidate
from uprof.retrieval.index import MemoryIndex
from uprof.retrieval.packer import PackProblem, PackResult, pack
from uprof.retrieval.ranker import (
    PoolSimilarity,
    analyse_query,
    rank_memories,
    rank_profile_items,
)
from uprof.retrieval.slices import LeftOut, PackedSlice, SliceOptions

#: A summarised intent keeps this share of the full intent's utility.
SUMMARY_VALUE = 0.6
#: Overhead groups with fixed ids; day groups follow them.
_LEGEND, _SECTION = 0, {Layer.ATTRIBUTE: 1, Layer.INTENT: 2, Layer.MEMORY: 3}
_FIXED_GROUPS = 4
_ACTIVE = frozenset({"", "active"})
_REASON_ORDER = {"budget": 0, "duplicate": 1, "low_relevance": 2}
_EMPTY = "no text to show"


class _Choice(NamedTuple):
    """One way to show one candidate: which candidate, which line, what it is worth.

    A NamedTuple: a few hundred are made per query, and tuples are cheap to build.
    """

    candidate: Candidate
    line: str
    cost: int
    utility: float
    day_group: int  # -1 unless the line sits under a day line
    memory_row: int  # position in the memory index, -1 for attributes and intents
    pool_pos: int  # position in the memory pool (similarity matrix), -1 otherwise
    marked: bool  # the line carries a mark the legend explains


#: One way to show a profile line: its text, its cost (tokens + newline) and whether it
#: is the summary (worth SUMMARY_VALUE of the full line).
_Variant = tuple[str, int, bool]


def _profile_variants(
    candidate: Candidate, counter: TokenCounter, *, summarise: bool
) -> tuple[tuple[_Variant, ...], bool]:
    """The lines a profile candidate can be shown as, and whether they carry a mark."""
    if summarise:
        full = render.intent_line(candidate, summary=False)
        short = render.intent_line(candidate, summary=True)
        lines = [(full, False)] + ([(short, True)] if short != full else [])
    else:
        lines = [(render.attribute_line(candidate), False)]
    variants = tuple((line, counter.count(line) + 1, short) for line, short in lines)
    return variants, render.needs_legend(candidate)


class ProfileLines:
    """Rendered lines and costs of attribute and intent candidates, kept across slices.

    A line depends only on its candidate (and the counter), yet every slice rendered and
    counted each of the subject's profile lines again: about 300 per slice on LoCoMo
    turns, a tenth of a slice's ranking time. A caller that serves many slices from the
    same candidate objects (the slice service keeps one per cached subject view, dropped
    with the view) passes one of these to ``build_slice``. Entries are keyed by the
    candidate object itself (identity, checked on every hit, so a new candidate is never
    served an old line) and bounded by ``max_entries``.
    """

    def __init__(self, counter: TokenCounter, max_entries: int = 20_000) -> None:
        self.counter = counter
        self._max = max_entries
        self._entries: dict[int, tuple[Candidate, bool, tuple[_Variant, ...], bool]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def variants(
        self, candidate: Candidate, *, summarise: bool
    ) -> tuple[tuple[_Variant, ...], bool]:
        hit = self._entries.get(id(candidate))
        if hit is not None and hit[0] is candidate and hit[1] == summarise:
            return hit[2], hit[3]
        variants, marked = _profile_variants(candidate, self.counter, summarise=summarise)
        if len(self._entries) >= self._max:
            self._entries.clear()
        self._entries[id(candidate)] = (candidate, summarise, variants, marked)
        return variants, marked


def _profile_choices(
    candidates: Sequence[Candidate],
    utilities: np.ndarray,
    counter: TokenCounter,
    min_utility: float,
    left_out: list[LeftOut],
    *,
    summarise: bool,
    lines: ProfileLines | None = None,
) -> list[_Choice]:
    """Choices for attributes or intents, best first; weak ones go to the left-out report."""
    out: list[_Choice] = []
    values = utilities.tolist()
    order = sorted(range(len(candidates)), key=lambda i: (-values[i], candidates[i].item_id))
    for i in order:
        candidate, utility = candidates[i], values[i]
        if not candidate.text.strip():
            left_out.append(_low(candidate, _EMPTY))
            continue
        if utility < min_utility:
            left_out.append(_low(candidate, f"utility {utility:.3g} below {min_utility:g}"))
            continue
        if lines is not None:
            variants, marked = lines.variants(candidate, summarise=summarise)
        else:
            variants, marked = _profile_variants(candidate, counter, summarise=summarise)
        out += [
            _Choice(
                candidate,
                line,
                cost,
                utility * SUMMARY_VALUE if short else utility,
                -1,
                -1,
                -1,
                marked,
            )
            for line, cost, short in variants
        ]
    return out


def _low(candidate: Candidate, detail: str) -> LeftOut:
    return LeftOut(candidate.item_id, candidate.layer, "low_relevance", detail)


def _memory_choices(
    index: MemoryIndex,
    rows: np.ndarray,
    utility: np.ndarray,
    options: SliceOptions,
    day_groups: dict[int, int],
    left_out: list[LeftOut],
) -> list[_Choice]:
    """Choices for the memory pool; day lines become shared overhead groups when grouping."""
    grouped = options.group_memories_by_day
    lines = index.lines if grouped else index.dated_lines
    costs = index.line_costs if grouped else index.dated_line_costs
    out: list[_Choice] = []
    # The pool's columns as Python values once: reading numpy scalars row by row cost
    # more than the rest of the loop.
    days, marks, pool_costs = (
        index.day_of[rows].tolist(),
        index.marked[rows].tolist(),
        costs[rows].tolist(),
    )
    candidates = index.candidates
    floor = options.min_utility
    for pos, (row, value) in enumerate(zip(rows.tolist(), utility.tolist(), strict=True)):
        candidate = candidates[row]
        if not candidate.text.strip():
            left_out.append(_low(candidate, _EMPTY))
            continue
        if value < floor:
            left_out.append(_low(candidate, f"utility {value:.3g} below {floor:g}"))
            continue
        day = -1
        if grouped:
            day = day_groups.setdefault(days[pos], _FIXED_GROUPS + len(day_groups))
        out.append(
            _Choice(candidate, lines[row], pool_costs[pos], value, day, row, pos, marks[pos])
        )
    return out


def _derived_links(
    choices: list[_Choice], index: MemoryIndex, options: SliceOptions
) -> dict[int, np.ndarray]:
    """Each profile choice and the memory choices it was derived from, both ways.

    An attribute or intent and the memory of the capture it was extracted from say
    the same thing twice (decision 0023: "dislikes: floral patterns" beside "I can't
    stand floral patterns"), so they count as duplicates: whichever is worth more is
    shown, and the budget goes to something else rather than to the repeat.
    """
    if not options.derived_duplicates:
        return {}
    choice_of_row = {c.memory_row: j for j, c in enumerate(choices) if c.memory_row >= 0}
    links: dict[int, set[int]] = {}
    for j, c in enumerate(choices):
        if c.memory_row >= 0:
            continue
        for capture in c.candidate.evidence:
            rows = index.rows_of_capture.get(capture, ())
            # A long capture becomes several memories (windows of sentences) and which one
            # a line came from is not recorded, so only a capture's sole memory is linked.
            if len(rows) != 1:
                continue
            for row in rows:
                k = choice_of_row.get(row)
                if k is not None:
                    links.setdefault(j, set()).add(k)
                    links.setdefault(k, set()).add(j)
    return {j: np.fromiter(sorted(ks), dtype=np.int64) for j, ks in links.items()}


def _similar_to(
    choices: list[_Choice], similarity: PoolSimilarity, derived: dict[int, np.ndarray]
) -> Callable[[int], np.ndarray]:
    """Similarity of every choice to choice j: memories compare within the pool, a profile
    line is a duplicate of the memories it was derived from, other pairs are 0."""
    pool = np.asarray([c.pool_pos for c in choices], dtype=np.int64)
    memories = np.flatnonzero(pool >= 0)

    def column(j: int) -> np.ndarray:
        out = np.zeros(len(choices))
        if pool[j] >= 0:
            out[memories] = similarity.column(int(pool[j]))[pool[memories]]
            out[j] = 0.0  # an item is not its own duplicate
        linked = derived.get(j)
        if linked is not None:
            out[linked] = 1.0
        return out

    return column


def _similar_to_many(
    choices: list[_Choice], similarity: PoolSimilarity, derived: dict[int, np.ndarray]
) -> Callable[[np.ndarray], np.ndarray] | None:
    """Similarity columns of many choices at once, when the pool computes them cheaper so."""
    if not similarity.batched:
        return None
    pool = np.asarray([c.pool_pos for c in choices], dtype=np.int64)
    memories = np.flatnonzero(pool >= 0)

    def columns(js: np.ndarray) -> np.ndarray:
        out = np.zeros((len(choices), len(js)))
        picked = [i for i, j in enumerate(js.tolist()) if pool[j] >= 0]
        if picked:
            sims = similarity.columns(pool[js[picked]])
            out[np.ix_(memories, np.asarray(picked, dtype=np.intp))] = sims[pool[memories]]
            out[js[picked], picked] = 0.0  # an item is not its own duplicate
        for i, j in enumerate(js.tolist()):
            linked = derived.get(j)
            if linked is not None:
                out[linked, i] = 1.0
        return out

    return columns


def _problem(
    choices: list[_Choice],
    index: MemoryIndex,
    similarity: PoolSimilarity,
    group_costs: np.ndarray,
    budget: int,
    options: SliceOptions,
) -> PackProblem:
    m = len(choices)
    owners: dict[str, int] = {}
    owner = np.asarray([owners.setdefault(c.candidate.item_id, len(owners)) for c in choices])
    groups = np.asarray(
        [[_LEGEND, _SECTION[c.candidate.layer], c.day_group] for c in choices], dtype=np.int64
    ).reshape(m, 3)
    if options.legend_only_when_marked:
        groups[~np.asarray([c.marked for c in choices], dtype=bool), 0] = -1
    derived = _derived_links(choices, index, options)
    return PackProblem(
        costs=np.asarray([c.cost for c in choices], dtype=np.int64),
        utility=np.asarray([c.utility for c in choices], dtype=np.float64),
        owner=owner,
        groups=groups,
        group_costs=group_costs,
        similar_to=_similar_to(choices, similarity, derived),
        similar_to_many=_similar_to_many(choices, similarity, derived),
        budget=budget,
        mmr_penalty=options.mmr_penalty,
        duplicate_threshold=options.duplicate_threshold,
        max_chosen=options.max_items,
    )


def _render(chosen: Sequence[_Choice], index: MemoryIndex, options: SliceOptions) -> str:
    """Sections in fixed order; profile items best first, memories chronologically."""
    grouped = options.group_memories_by_day
    lines: list[str] = []
    if chosen and (not options.legend_only_when_marked or any(c.marked for c in chosen)):
        lines.append(render.LEGEND)
    for layer in render.SECTION_ORDER:
        picked = [c for c in chosen if c.candidate.layer == layer]
        if not picked:
            continue
        lines.append(render.SECTION_HEADERS[layer])
        if layer != Layer.MEMORY:
            lines += [
                c.line for c in sorted(picked, key=lambda c: (-c.utility, c.candidate.item_id))
            ]
            continue
        last_day = None
        for c in sorted(picked, key=lambda c: c.memory_row):
            day = int(index.day_of[c.memory_row])
            if grouped and day != last_day:
                lines.append(index.day_headers[day])
                last_day = day
            lines.append(c.line)
    return render.assemble(lines)


def build_slice(
    *,
    query: str,
    attributes: Sequence[Candidate],
    intents: Sequence[Candidate],
    memory_index: MemoryIndex,
    budget_tokens: int,
    counter: TokenCounter,
    query_vector: np.ndarray | None,
    now: datetime,
    options: SliceOptions = SliceOptions(),  # noqa: B008 - frozen, so sharing it is safe
    attribute_vectors: np.ndarray | None = None,
    intent_vectors: np.ndarray | None = None,
    profile_lines: ProfileLines | None = None,
) -> PackedSlice:
    """Choose and render the most useful gated items for query within budget_tokens.

    query_vector is the query's embedding from the embedder that built the
    index's vectors (None: lexical-only). attribute_vectors / intent_vectors
    optionally add embedding match for those layers (one row per candidate).
    The returned text is counted with counter and never exceeds budget_tokens.
    profile_lines optionally keeps attribute and intent lines across calls (it is used
    only when it counts with this very counter).
    """
    lines = (
        profile_lines if profile_lines is not None and profile_lines.counter is counter else None
    )
    with telemetry.span("uprof.slice.rank", memories=len(memory_index)) as ranked:
        q = analyse_query(query)
        left_out: list[LeftOut] = []
        ranking = rank_memories(memory_index, q, query_vector, now, options)
        active = [c for c in intents if c.status in _ACTIVE]
        active_rows = [i for i, c in enumerate(intents) if c.status in _ACTIVE]
        left_out += [_low(c, f"intent is {c.status}") for c in intents if c.status not in _ACTIVE]
        intent_vecs = None if intent_vectors is None else np.asarray(intent_vectors)[active_rows]
        choices = _profile_choices(
            attributes,
            rank_profile_items(
                attributes,
                q,
                attribute_vectors,
                query_vector,
                options.attribute_base_utility,
                index=memory_index,
                ranking=ranking,
                options=options,
            ),
            counter,
            options.min_utility,
            left_out,
            summarise=False,
            lines=lines,
        )
        choices += _profile_choices(
            active,
            rank_profile_items(
                active,
                q,
                intent_vecs,
                query_vector,
                options.intent_base_utility,
                index=memory_index,
                ranking=ranking,
                options=options,
            ),
            counter,
            options.min_utility,
            left_out,
            summarise=True,
            lines=lines,
        )
        day_groups: dict[int, int] = {}
        choices += _memory_choices(
            memory_index, ranking.rows, ranking.utility, options, day_groups, left_out
        )
        group_costs = _group_costs(memory_index, day_groups, counter)
        problem = _problem(
            choices, memory_index, ranking.similarity, group_costs, max(budget_tokens, 0), options
        )
        ranked.set(candidates=len(choices))
    with telemetry.span("uprof.slice.pack", candidates=len(choices)) as packing:
        result = pack(problem)
        packed = _finish(
            choices, problem, result, memory_index, ranking.rows, left_out, counter, options
        )
        packing.set(items=len(packed.items), n_tokens=packed.n_tokens)
    return packed


def _group_costs(
    index: MemoryIndex, day_groups: dict[int, int], counter: TokenCounter
) -> np.ndarray:
    costs = np.zeros(_FIXED_GROUPS + len(day_groups), dtype=np.int64)
    costs[_LEGEND] = counter.count(render.LEGEND) + 1
    for layer, group in _SECTION.items():
        costs[group] = counter.count(render.SECTION_HEADERS[layer]) + 1
    for day, group in day_groups.items():
        costs[group] = int(index.day_header_costs[day])
    return costs


def _finish(
    choices: list[_Choice],
    problem: PackProblem,
    result: PackResult,
    index: MemoryIndex,
    pool_rows: np.ndarray,
    left_out: list[LeftOut],
    counter: TokenCounter,
    options: SliceOptions,
) -> PackedSlice:
    """Render, verify the real token count (dropping the weakest items if ever over), report."""
    chosen = list(result.chosen)
    text = _render([choices[j] for j in chosen], index, options)
    n_tokens = counter.count(text)
    # Costs are exact for newline-joined lines, but the real count is the contract:
    # should the tokenizer ever merge across a line break, shed the weakest items.
    while n_tokens > problem.budget and chosen:
        chosen.remove(min(chosen, key=lambda j: (problem.utility[j] / problem.costs[j], -j)))
        text = _render([choices[j] for j in chosen], index, options)
        n_tokens = counter.count(text)
    taken = {choices[j].candidate.item_id for j in chosen}
    reported: set[str] = set(taken) | {lo.item_id for lo in left_out}
    for j, choice in enumerate(choices):
        item_id = choice.candidate.item_id
        if item_id in reported:
            continue
        reported.add(item_id)
        if j in result.duplicate_of:
            twin = choices[result.duplicate_of[j]].candidate.item_id
            left_out.append(
                LeftOut(item_id, choice.candidate.layer, "duplicate", f"near-duplicate of {twin}")
            )
        elif len(result.chosen) >= options.max_items:
            # Reported like any other cut (review of 0143, bug IG: it was in neither list).
            detail = (
                f"a slice holds at most {options.max_items} items; more relevant ones took them"
            )
            left_out.append(LeftOut(item_id, choice.candidate.layer, "budget", detail))
        else:
            detail = f"needs {choice.cost} tokens; the budget went to more relevant items"
            left_out.append(LeftOut(item_id, choice.candidate.layer, "budget", detail))
    # Most actionable first: what the budget cut, then duplicates, then the irrelevant;
    # the memories never retrieved (all low relevance, ready-made by the index) last.
    left_out.sort(key=lambda lo: _REASON_ORDER[lo.reason])
    in_pool = np.zeros(len(index), dtype=bool)
    in_pool[pool_rows] = True
    items = _in_rendered_order([choices[j] for j in chosen])
    return PackedSlice(
        text=text,
        items=items,
        n_tokens=n_tokens,
        ranked_out=tuple(left_out),
        _all_not_retrieved=index.not_retrieved,
        _not_retrieved_rows=np.flatnonzero(~in_pool),
    )


def _in_rendered_order(chosen: list[_Choice]) -> tuple[Candidate, ...]:
    """Items in the order their lines appear in the text."""
    rank = {layer: i for i, layer in enumerate(render.SECTION_ORDER)}

    def key(c: _Choice) -> tuple[int, float, int, str]:
        if c.candidate.layer == Layer.MEMORY:
            return (rank[Layer.MEMORY], 0.0, c.memory_row, "")
        return (rank[c.candidate.layer], -c.utility, 0, c.candidate.item_id)

    return tuple(c.candidate for c in sorted(chosen, key=key))
