"""Baselines: BM25 arithmetic, tie-breaking, packing, rendering, budgets."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.baselines import (
    BM25System,
    EmbeddingSystem,
    HybridRRFSystem,
    OracleSystem,
    RecencySystem,
    TfidfSystem,
    bm25_scores,
    bm25_tokens,
    build_bm25_index,
)
from benchmarks.bench_common import (
    BenchTurn,
    count_tokens,
    fit_exactly,
    format_locomo_datetime,
    join_lines,
    line_costs,
    pack_first_fit,
    pack_until_full,
    parse_locomo_datetime,
    render_bullet_line,
    render_dialogue_line,
    render_plain_line,
)
from tests.bench.synthetic import hashed_embedder

T0 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
NOW = T0 + timedelta(days=30)


def turns(texts: list[str], actor: str = "Ann") -> list[BenchTurn]:
    return [
        BenchTurn(f"D1:{i + 1}", actor, t, T0 + timedelta(seconds=i), 1)
        for i, t in enumerate(texts)
    ]


def test_bm25_tokens() -> None:
    assert bm25_tokens("[1:56 pm on 8 May, 2023] Ann: Don't GO-now!") == [
        "1",
        "56",
        "pm",
        "on",
        "8",
        "may",
        "2023",
        "ann",
        "don",
        "t",
        "go",
        "now",
    ]


def test_bm25_scores_by_hand() -> None:
    docs = [["cat"], ["cat", "cat", "dog", "dog"], ["dog"], ["fish"], ["bird"]]
    index = build_bm25_index(docs)
    # N = 5, df(cat) = 2: idf = ln(3.5 / 2.5) = 0.33647; avgdl = 8 / 5 = 1.6.
    idf = math.log(3.5 / 2.5)
    k1, b, avgdl = 1.5, 0.75, 1.6

    def term(tf: float, dl: float) -> float:
        return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

    scores = bm25_scores(index, ["cat"])
    assert scores[0] == pytest.approx(term(1, 1))
    assert scores[1] == pytest.approx(term(2, 4))
    assert scores[2] == scores[3] == scores[4] == 0.0
    # Worked by hand: norms 1.5 * (0.25 + 0.75 / 1.6) = 1.078 and 1.5 * (0.25 + 0.75 * 2.5)
    # = 3.1875, so 0.33647 * 2.5 / 2.078 and 0.33647 * 5 / 5.1875; the longer
    # document loses despite tf = 2.
    assert scores[0] == pytest.approx(0.40478, abs=1e-4)
    assert scores[1] == pytest.approx(0.32431, abs=1e-4)
    # A repeated query term counts twice.
    assert bm25_scores(index, ["cat", "cat"])[0] == pytest.approx(2 * scores[0])


def test_bm25_idf_floor_for_very_common_terms() -> None:
    # "the" is in 4 of 5 docs: raw Okapi idf ln(1.5 / 4.5) < 0 is raised to
    # 0.25 x the mean idf over the vocabulary, so a match still helps a little.
    docs = [["the", "a"], ["the", "b"], ["the", "c"], ["the", "d"], ["e"]]
    index = build_bm25_index(docs)
    raw = {
        t: math.log((5 - df + 0.5) / (df + 0.5))
        for t, df in {"the": 4, "a": 1, "b": 1, "c": 1, "d": 1, "e": 1}.items()
    }
    floor = 0.25 * sum(raw.values()) / len(raw)
    assert raw["the"] < 0 < floor
    assert index.idf["the"] == pytest.approx(floor)
    assert index.idf["a"] == pytest.approx(raw["a"])
    scores = bm25_scores(index, ["the"])
    assert (scores[:4] > 0).all() and scores[4] == 0.0


DIARY = [
    "we went hiking in the alps",  # 0: hiking, in, the, alps
    "the weather was nice",  # 1: the
    "alps alps hiking trip photos",  # 2: alps x2, hiking
    "dinner with friends",
    "new phone arrived",
    "reading a novel",
    "coffee with sam",
    "late train home",
]


def test_bm25_system_ranking_hand_checked() -> None:
    # N = 8, avgdl = 30 / 8 = 3.75. idf(hiking) = idf(alps) = idf(the) = ln(6.5 / 2.5)
    # = 0.9555, idf(in) = ln(7.5 / 1.5) = 1.6094.
    # doc 0 (dl 6, norm 2.175): (3 * 0.9555 + 1.6094) * 2.5 / 3.175 = 3.5244
    # doc 2 (dl 5, norm 1.875): 0.9555 * (2 * 2.5 / 3.875 + 2.5 / 2.875) = 2.0638
    # doc 1 (dl 4, norm 1.575): 0.9555 * 2.5 / 2.575 = 0.9277; the rest score 0.
    index = build_bm25_index([bm25_tokens(line) for line in DIARY])
    scores = bm25_scores(index, bm25_tokens("hiking in the alps"))
    assert scores[0] == pytest.approx(3.5244, abs=1e-3)
    assert scores[2] == pytest.approx(2.0638, abs=1e-3)
    assert scores[1] == pytest.approx(0.9277, abs=1e-3)
    assert (scores[3:] == 0).all()

    system = BM25System(render=render_plain_line)
    system.ingest("s", turns(DIARY))
    # Budget for exactly one line: the top-ranked one.
    sl = system.slice("s", "hiking in the alps", count_tokens(DIARY[0]), NOW)
    assert sl.text == DIARY[0]
    assert [i.source_refs for i in sl.items] == [("D1:1",)]
    # Room for three lines: ranks 0, 2, 1 rendered chronologically 0, 1, 2.
    three = count_tokens(join_lines(DIARY[:3]))
    sl = system.slice("s", "hiking in the alps", three, NOW)
    assert sl.text == join_lines(DIARY[:3])
    # Room for two: the two best, not the two oldest.
    two = count_tokens(join_lines([DIARY[0], DIARY[2]]))
    assert system.slice("s", "hiking in the alps", two, NOW).text == join_lines(
        [DIARY[0], DIARY[2]]
    )


def test_ties_broken_chronologically() -> None:
    system = BM25System(render=render_plain_line)
    system.ingest("s", turns(["apple pie", "banana", "apple pie", "apple pie"]))
    cost = count_tokens("apple pie")
    assert system.slice("s", "apple", cost, NOW).items == (
        system.slice("s", "apple", cost, NOW).items
    )
    assert system.slice("s", "apple", cost, NOW).items[0].source_refs == ("D1:1",)
    sl = system.slice("s", "apple", count_tokens("apple pie\napple pie"), NOW)
    assert [i.source_refs for i in sl.items] == [("D1:1",), ("D1:3",)]


def test_unmatched_turns_fill_remaining_budget_chronologically() -> None:
    system = BM25System(render=render_plain_line)
    system.ingest("s", turns(["zebra", "lion", "apple", "tiger"]))
    sl = system.slice("s", "apple", 1000, NOW)
    assert sl.text == "zebra\nlion\napple\ntiger"
    strict = BM25System(render=render_plain_line, keep_zero=False)
    strict.ingest("s", turns(["zebra", "lion", "apple", "tiger"]))
    assert strict.slice("s", "apple", 1000, NOW).text == "apple"


def test_first_fit_skips_a_line_that_does_not_fit_and_continues() -> None:
    lines = ["short one", "a much much longer line that will not fit in the budget at all", "tiny"]
    costs = line_costs(lines)
    budget = count_tokens("short one\ntiny")
    assert pack_first_fit([0, 1, 2], costs, budget) == [0, 2]
    assert pack_until_full([0, 1, 2], costs, budget) == [0]


def test_recency_takes_newest_contiguous_turns() -> None:
    system = RecencySystem(render=render_plain_line)
    system.ingest("s", turns(["one", "two", "a rather long third line of text here", "four"]))
    sl = system.slice("s", "q", count_tokens("four") + 2, NOW)
    assert sl.text == "four"  # the long third line stops the walk back; "two" is never reached
    sl = system.slice("s", "q", 1000, NOW)
    assert sl.text == "one\ntwo\na rather long third line of text here\nfour"


def test_ingest_keeps_chronological_order() -> None:
    system = RecencySystem(render=render_plain_line)
    later = turns(["later"])[0]
    earlier = BenchTurn("D0:1", "Ann", "earlier", T0 - timedelta(days=1), 0)
    system.ingest("s", [later])
    system.ingest("s", [earlier])
    assert system.slice("s", "q", 100, NOW).text == "earlier\nlater"


def test_tfidf_ranks_matching_turn_first() -> None:
    system = TfidfSystem(render=render_plain_line)
    system.ingest("s", turns(["the cat sat", "my violin lesson", "the dog ran"]))
    sl = system.slice("s", "violin", count_tokens("my violin lesson"), NOW)
    assert sl.text == "my violin lesson"


def test_embedding_system_with_fake_embedder() -> None:
    calls: list[int] = []
    fake = hashed_embedder()

    def counting(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return fake(texts)

    system = EmbeddingSystem(counting, render=render_plain_line)
    system.ingest("s", turns(["rainy day in london", "sunny beach holiday", "london calling"]))
    sl = system.slice("s", "sunny beach", count_tokens("sunny beach holiday"), NOW)
    assert sl.text == "sunny beach holiday"
    system.slice("s", "sunny beach", 100, NOW)
    system.ingest("t", turns(["sunny beach holiday"]))
    assert sum(calls) == 4  # three lines + one query; repeats come from the cache


def test_hybrid_fuses_bm25_and_dense_ranks() -> None:
    # BM25 for "apple": line 0, then the unmatched 1, 2 (chronological). The dense
    # fake ranks 2, 1, 0. RRF (k = 60): line 0 and line 2 score 1/61 + 1/63 = 0.032266
    # each (tie: chronological), line 1 scores 2/62 = 0.032258. So two lines' room
    # gets 0 and 2, which neither ranker alone would pick.
    vectors = {
        "apple": [1.0, 0.0],
        "apple pie": [0.0, 1.0],
        "banana bread": [0.5, 0.5],
        "cherry tart": [1.0, 0.1],
    }

    def fake(texts: list[str]) -> np.ndarray:
        return np.array([vectors[t] for t in texts], dtype=np.float32)

    lines = ["apple pie", "banana bread", "cherry tart"]
    system = HybridRRFSystem(fake, render=render_plain_line)
    system.ingest("s", turns(lines))
    two = count_tokens(join_lines([lines[0], lines[2]]))
    assert system.slice("s", "apple", two, NOW).text == join_lines([lines[0], lines[2]])
    bm25 = BM25System(render=render_plain_line)
    bm25.ingest("s", turns(lines))
    assert bm25.slice("s", "apple", two, NOW).text == join_lines(lines[:2])
    dense = EmbeddingSystem(fake, render=render_plain_line)
    dense.ingest("s", turns(lines))
    assert dense.slice("s", "apple", two, NOW).text == join_lines(lines[1:])
    system.forget("s")
    assert system.slice("s", "apple", two, NOW).text == ""


def test_oracle_serves_only_gold_turns() -> None:
    system = OracleSystem(render=render_plain_line)
    system.ingest("s", turns(["a", "b", "c", "d"]))
    system.set_gold("s", "q", ["D1:4", "D1:2", "D9:9"])
    sl = system.slice("s", "q", 100, NOW)
    assert sl.text == "b\nd"
    assert [i.source_refs for i in sl.items] == [("D1:2",), ("D1:4",)]


def test_forget_drops_the_subject() -> None:
    system = BM25System(render=render_plain_line)
    system.ingest("s", turns(["hello"]))
    system.forget("s")
    assert system.slice("s", "hello", 100, NOW).text == ""


def test_dialogue_rendering_and_dates() -> None:
    moment = parse_locomo_datetime("1:56 pm on 8 May, 2023") + timedelta(seconds=7)
    turn = BenchTurn("D1:3", "Caroline", "Look! [shares photo: a dog]", moment, 1)
    assert (
        render_dialogue_line(turn)
        == "[1:56 pm on 8 May, 2023] Caroline: Look! [shares photo: a dog]"
    )
    assert render_bullet_line(turn) == "- Look! [shares photo: a dog]"
    for text in (
        "12:05 am on 1 January, 2022",
        "12:30 pm on 31 December, 2023",
        "9:00 am on 10 July, 2023",
    ):
        assert format_locomo_datetime(parse_locomo_datetime(text)) == text


line_text = (
    st.text(
        alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_categories=("Cs",)),
        min_size=1,
        max_size=60,
    )
    .map(str.strip)
    .filter(bool)
)


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(line_text, min_size=1, max_size=25),
    budget=st.integers(0, 200),
    seed=st.integers(0, 10**6),
)
def test_packer_never_exceeds_budget(lines: list[str], budget: int, seed: int) -> None:
    order = np.random.default_rng(seed).permutation(len(lines)).tolist()
    costs = line_costs(lines)
    chosen = pack_first_fit(order, costs, budget)
    kept = fit_exactly([(i, lines[i]) for i in chosen], budget)
    text = join_lines([line for _, line in sorted(kept)])
    assert count_tokens(text) <= budget
    # Whatever was packed is a rank-order subsequence of the candidates.
    positions = [i for i, _ in kept]
    assert positions == [i for i in order if i in set(positions)]


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(line_text, min_size=1, max_size=25), seed=st.integers(0, 10**6))
def test_additive_cost_is_exact_for_stripped_lines(lines: list[str], seed: int) -> None:
    # The newline never merges with the next line's first token, so packing can
    # budget exactly instead of pessimistically.
    costs = line_costs(lines)
    chosen = sorted(
        np.random.default_rng(seed).permutation(len(lines))[: max(1, len(lines) // 2)].tolist()
    )
    last = chosen[-1]
    predicted = sum(costs.with_newline[i] for i in chosen) - (
        costs.with_newline[last] - costs.alone[last]
    )
    assert predicted == count_tokens(join_lines([lines[i] for i in chosen]))


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(line_text, min_size=1, max_size=30), budget=st.integers(1, 300), query=line_text
)
def test_every_baseline_slice_fits(texts: list[str], budget: int, query: str) -> None:
    systems = [
        RecencySystem(),
        BM25System(),
        TfidfSystem(),
        EmbeddingSystem(hashed_embedder()),
        OracleSystem(),
    ]
    for system in systems:
        system.ingest("s", turns(texts))
        if isinstance(system, OracleSystem):
            system.set_gold("s", query, [f"D1:{i + 1}" for i in range(len(texts))])
        sl = system.slice("s", query, budget, NOW)
        assert count_tokens(sl.text) <= budget
        assert len(sl.items) == (sl.text.count("\n") + 1 if sl.text else 0)


@pytest.mark.model
def test_the_mpnet_baseline_ranks_by_all_mpnet_base_v2() -> None:
    """`embedding-mpnet`: dense top-k with the model `uprof models fetch mpnet` installed
    (make setup), shared by the systems built from one factory set."""
    from benchmarks.baselines import baseline_factories

    factories = baseline_factories(["embedding", "embedding-mpnet"], render=render_plain_line)
    mpnet = factories["embedding-mpnet"]()
    assert isinstance(mpnet, EmbeddingSystem)
    lines = ["My train to work was late again", "I adopted a golden retriever puppy last month"]
    mpnet.ingest("s", turns(lines))
    assert mpnet._embed(["x"]).shape == (1, 768)
    sl = mpnet.slice("s", "Which animal lives with me?", count_tokens(lines[1]) + 4, NOW)
    assert sl.text.endswith(lines[1]) and "train" not in sl.text  # room for one: the dog
    assert factories["embedding"]()._embed(["x"]).shape == (1, 384)  # MiniLM stays the SPEC's
