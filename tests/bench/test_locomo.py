"""LoCoMo-ER@B harness: evidence normalisation, capture, routing and scoring rules."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from benchmarks.baselines import BM25System, OracleSystem, RecencySystem, baseline_factories
from benchmarks.bench_common import BenchSlice, BenchTurn, SliceItemRef, count_tokens
from benchmarks.locomo import (
    Conversation,
    Coverage,
    audit_positions,
    ceiling,
    coverage,
    load_locomo,
    main,
    normalise_evidence,
    query_plan,
    routed_speakers,
    run_locomo,
    score_question,
    subjects_for_mode,
)
from tests.bench.synthetic import hashed_embedder, locomo_conversation, write_locomo

KNOWN = ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1", "D2:2", "D2:3", "D11:26", "D30:5", "D8:6", "D9:17"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["D8:6; D9:17"], ("D8:6", "D9:17")),
        (["D1:1 D1:2"], ("D1:1", "D1:2")),
        (["D1:1,D1:3"], ("D1:1", "D1:3")),
        (["D:11:26"], ("D11:26",)),
        (["D30:05"], ("D30:5",)),
        (["D1:4", "D10:19", "D"], ("D1:4",)),  # unknown ids and a bare "D" dropped
        (["D2:3", "D2:3", "D2:03"], ("D2:3",)),  # de-duplicated after normalising
        ([], ()),
        (["D99:1"], ()),
    ],
)
def test_normalise_evidence(raw: list[str], expected: tuple[str, ...]) -> None:
    assert normalise_evidence(raw, KNOWN) == expected


@pytest.fixture()
def conv(tmp_path: Path) -> Conversation:
    convs = load_locomo(write_locomo(tmp_path / "locomo.json"), audit_path=None)
    assert len(convs) == 1
    return convs[0]


def test_questions_kept_and_skipped(conv: Conversation) -> None:
    got = {q.qa_index: (q.category, q.evidence) for q in conv.questions}
    assert got == {
        0: (4, ("D1:1",)),
        1: (1, ("D1:1", "D2:2")),
        2: (2, ("D2:1", "D1:2")),
        3: (3, ("D1:4",)),
        7: (4, ("D2:3", "D1:4")),
    }  # 4 and 5 have no evidence left, 6 is category 5


def test_turns_are_captured_events(conv: Conversation) -> None:
    assert [t.source_ref for t in conv.turns] == [
        "D1:1",
        "D1:2",
        "D1:3",
        "D1:4",
        "D2:1",
        "D2:2",
        "D2:3",
    ]
    start = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert [t.occurred_at for t in conv.turns[:4]] == [
        start + timedelta(seconds=i) for i in range(4)
    ]
    assert conv.turns[4].occurred_at == datetime(2023, 6, 12, 10, 4, tzinfo=UTC)
    assert (
        conv.turns[2].content == "Look at him sleeping. [shares photo: a photo of a dog on a couch]"
    )
    assert conv.turns[2].actor == "Alice" and conv.turns[2].session == 1
    # "now" is the last session *with turns* plus one day; the date-only key is ignored.
    assert conv.now == datetime(2023, 6, 13, 10, 4, tzinfo=UTC)
    joined = " ".join(t.content for t in conv.turns)
    assert "Alice has a dog named Rufus" not in joined  # observations never ingested


class FixedSystem:
    """Returns the same slice for every query (to exercise the scorer)."""

    name = "fixed"

    def __init__(self, sl: BenchSlice) -> None:
        self.sl = sl

    def ingest(self, subject_key: str, turns: Sequence[BenchTurn]) -> None:
        pass

    def slice(self, subject_key: str, query: str, budget_tokens: int, now: datetime) -> BenchSlice:
        return self.sl


def _question(conv: Conversation, qa_index: int):  # type: ignore[no-untyped-def]
    return next(q for q in conv.questions if q.qa_index == qa_index)


def test_verbatim_coverage_is_normalised(conv: Conversation) -> None:
    q = _question(conv, 1)  # evidence D1:1, D2:2
    text = "noise\nI  ADOPTED a beagle\tcalled Rufus LAST week.\n"  # case and whitespace differ
    n, over, union, verbatim, _, _ = score_question(conv, q, [BenchSlice(text, ())], 4096)
    assert not over and n == count_tokens(text)
    assert verbatim == Coverage(strict=0.0, frac=0.5, any=1.0, session=0.5)
    assert union == verbatim
    # NFKC: full-width letters compare equal to ASCII.
    wide = (
        "\uff52\uff55\uff46\uff55\uff53 chewed my running shoes yesterday. "
        "I adopted a beagle called Rufus last week."
    )
    _, _, union, _, _, _ = score_question(conv, q, [BenchSlice(wide, ())], 4096)
    assert union.strict == 1.0


def test_caption_suffix_is_optional(conv: Conversation) -> None:
    turn = conv.verbatim["D1:3"]
    assert turn == "look at him sleeping."
    assert conv.verbatim_captioned["D1:3"].endswith("[shares photo: a photo of a dog on a couch]")


def test_over_budget_zeroes_every_metric(conv: Conversation) -> None:
    q = _question(conv, 0)
    text = "I adopted a beagle called Rufus last week. " + "filler " * 300
    budget = 256
    assert count_tokens(text) > budget
    n, over, union, verbatim, a_union, _ = score_question(
        conv, q, [BenchSlice(text, (SliceItemRef(("D1:1",)),))], budget
    )
    assert over and n == count_tokens(text)
    assert union == Coverage.zero() and verbatim == Coverage.zero()
    assert a_union == Coverage.zero()


def test_derived_credit_needs_at_most_three_source_turns(conv: Conversation) -> None:
    q = _question(conv, 1)  # D1:1, D2:2
    concise = BenchSlice("Alice has a dog.", (SliceItemRef(("D1:1", "D1:3", "D2:1")),))
    _, _, union, verbatim, _, _ = score_question(conv, q, [concise], 4096)
    assert verbatim == Coverage.zero()
    assert union == Coverage(strict=0.0, frac=0.5, any=1.0, session=0.5)

    summary = BenchSlice("Alice and her dog.", (SliceItemRef(("D1:1", "D1:2", "D1:3", "D2:2")),))
    _, _, union, _, _, _ = score_question(conv, q, [summary], 4096)
    assert union == Coverage.zero()  # four source turns: a summary, no credit

    both = BenchSlice("x", (SliceItemRef(("D1:1",)), SliceItemRef(("D2:2", "D2:2"))))
    _, _, union, _, _, _ = score_question(conv, q, [both], 4096)
    assert union.strict == 1.0


def test_coverage_metrics_by_hand() -> None:
    evidence = ["D1:1", "D1:2", "D2:1", "D3:4"]
    got = coverage({"D1:2", "D3:4"}, evidence)
    assert got == Coverage(strict=0.0, frac=0.5, any=1.0, session=2 / 3)
    assert coverage(set(evidence), evidence) == Coverage(1.0, 1.0, 1.0, 1.0)


def test_p_routing_rule(conv: Conversation) -> None:
    speakers = ("Alice", "Bob")
    assert routed_speakers("What did Alice's dog chew?", speakers) == ["Alice"]
    assert routed_speakers("Did Bob and Alice meet?", speakers) == ["Alice", "Bob"]
    assert routed_speakers("Where does Alicente work?", speakers) == []  # word boundary
    assert routed_speakers("where does alice work?", speakers) == []  # names are capitalised

    assert query_plan(conv, "Where did Bob run?", "P-routed", 512) == [("conv-26/Bob", 512)]
    halves = [("conv-26/Alice", 256), ("conv-26/Bob", 256)]
    assert query_plan(conv, "Did Bob and Alice meet?", "P-routed", 512) == halves
    assert query_plan(conv, "Who lives in Lisbon?", "P-routed", 512) == halves
    assert query_plan(conv, "Where did Bob run?", "P-both", 512) == halves
    assert query_plan(conv, "Where did Bob run?", "S", 512) == [("conv-26", 512)]

    subjects = subjects_for_mode(conv, "P-routed")
    assert {k: [t.source_ref for t in v] for k, v in subjects.items()} == {
        "conv-26/Alice": ["D1:1", "D1:3", "D2:2"],
        "conv-26/Bob": ["D1:2", "D1:4", "D2:1", "D2:3"],
    }


def test_p_routed_ceiling(conv: Conversation) -> None:
    # qa 0 names Alice, evidence D1:1 is Alice's: reachable.
    assert ceiling(conv, _question(conv, 0), "P-routed").strict == 1.0
    # qa 2 names Bob; D1:2 and D2:1 are both Bob's.
    assert ceiling(conv, _question(conv, 2), "P-routed").strict == 1.0
    # qa 1 names Alice; both evidence turns are Alice's.
    assert ceiling(conv, _question(conv, 1), "P-routed").frac == 1.0
    # qa 7 names nobody: both subjects queried, everything reachable.
    assert ceiling(conv, _question(conv, 7), "P-routed").strict == 1.0


def test_p_routed_ceiling_below_one_when_evidence_is_the_other_persons(tmp_path: Path) -> None:
    raw = locomo_conversation()
    raw["qa"] = [
        {
            "question": "Does Alice know where Carla lives?",
            "answer": "Lisbon",
            "evidence": ["D1:4", "D1:1"],
            "category": 4,
        }
    ]
    (c,) = load_locomo(write_locomo(tmp_path / "x.json", [raw]), audit_path=None)
    got = ceiling(c, c.questions[0], "P-routed")
    assert got == Coverage(strict=0.0, frac=0.5, any=1.0, session=1.0)
    assert ceiling(c, c.questions[0], "P-both").strict == 1.0


def test_audit_overlay_where_it_differs(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "locomo.json")
    conv = locomo_conversation()
    audit = [
        {
            "question_id": "locomo_0_qa0",
            "question": conv["qa"][0]["question"],
            "category": 4,
            "cited_evidence": ["D1:1"],
            "correct_evidence": ["D1:1", "D2:2"],
        },
        {
            "question_id": "locomo_0_qa2",
            "question": "a different question text",
            "category": 2,
            "cited_evidence": ["D2:1"],
            "correct_evidence": ["D1:1"],
        },
        {
            "question_id": "locomo_0_qa3",
            "question": conv["qa"][3]["question"],
            "category": 3,
            "cited_evidence": ["D1:4"],
            "correct_evidence": [],
        },
    ]
    (tmp_path / "errors.json").write_text(json.dumps(audit), encoding="utf-8")
    (c,) = load_locomo(data, tmp_path / "errors.json")
    by_index = {q.qa_index: q for q in c.questions}
    assert by_index[0].audited == ("D1:1", "D2:2")
    assert by_index[0].evidence == ("D1:1",)  # an overlay, never a silent replacement
    assert by_index[2].audited == by_index[2].evidence  # question text mismatch: ignored
    assert by_index[3].audited is None  # nothing left: not in the audited column
    assert by_index[1].audited == by_index[1].evidence


def test_audit_positions_come_from_the_data_not_a_list_of_ids() -> None:
    # A split that withholds conversations: the file's second conversation was the
    # fourth of the original, so its audit ids say locomo_3_...; no id list needed.
    first, second = locomo_conversation("conv-x"), locomo_conversation("conv-y")
    second["qa"] = [{**qa, "question": qa["question"] + " (y)"} for qa in second["qa"]]
    audit = {
        "locomo_0_qa0": {"question": first["qa"][0]["question"]},
        "locomo_0_qa3": {"question": first["qa"][3]["question"]},
        "locomo_3_qa1": {"question": second["qa"][1]["question"]},
        "locomo_3_qa2": {"question": second["qa"][2]["question"]},
        # A conversation of the original file that is not in this one.
        "locomo_2_qa0": {"question": "a question no conversation here asks"},
    }
    assert audit_positions([first, second], audit) == {"conv-x": 0, "conv-y": 3}
    # The full file: positions equal to the file's own order still come out.
    audit["locomo_1_qa1"] = audit.pop("locomo_3_qa1")
    audit["locomo_1_qa2"] = audit.pop("locomo_3_qa2")
    assert audit_positions([first, second], audit) == {"conv-x": 0, "conv-y": 1}


def test_run_locomo_end_to_end(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "locomo.json")
    systems = baseline_factories(
        ["recency", "bm25", "tfidf", "embedding", "oracle"], embed=hashed_embedder()
    )
    budgets = [32, 64, 4096]
    out = tmp_path / "out" / "result.json"
    md = tmp_path / "bench.md"
    report = run_locomo(
        data, out, systems, budgets=budgets, modes=["S", "P-routed", "P-both"], markdown_path=md
    )

    n_questions = 5
    rows = [
        json.loads(line)
        for line in (tmp_path / "out" / "result.rows.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 5 * 3 * len(budgets) * n_questions
    assert set(rows[0]) >= {
        "sample_id",
        "qa_index",
        "category",
        "B",
        "mode",
        "system",
        "n_tokens",
        "over_budget",
        "strict",
        "frac",
        "any",
        "session",
    }
    assert all(r["n_tokens"] <= r["B"] and not r["over_budget"] for r in rows)

    saved = json.loads(out.read_text())
    assert saved["results"].keys() == report["results"].keys()
    cell = report["results"]["bm25"]["S"]["4096"]
    for key in (
        "strict",
        "frac",
        "any",
        "session",
        "by_category",
        "mean_tokens",
        "p50_ms",
        "p95_ms",
        "over_budget",
        "verbatim",
        "macro",
        "by_conversation",
    ):
        assert key in cell
    assert cell["n"] == n_questions
    # The whole conversation fits in 4096 tokens: every system but none misses.
    for name in ("recency", "bm25", "tfidf", "embedding", "oracle"):
        assert report["results"][name]["S"]["4096"]["strict"] == 1.0
        assert report["results"][name]["P-both"]["4096"]["strict"] == 1.0
    # The oracle fits all evidence in 64 tokens; recency at 32 cannot reach session 1.
    assert report["results"]["oracle"]["S"]["64"]["strict"] == 1.0
    assert report["results"]["recency"]["S"]["32"]["by_category"]["4"]["strict"] < 1.0
    assert report["er_auc"]["oracle"]["S"]["strict"] == pytest.approx(
        sum(report["results"]["oracle"]["S"][str(b)]["strict"] for b in budgets) / len(budgets)
    )
    assert report["ceiling"]["S"]["strict"] == 1.0
    text = md.read_text()
    assert "<!-- bench:locomo:start -->" in text and "| bm25 |" in text


def test_recency_and_bm25_differ_at_small_budget(tmp_path: Path) -> None:
    (c,) = load_locomo(write_locomo(tmp_path / "l.json"), audit_path=None)
    query = "What is the name of Alice's beagle?"  # only D1:1 mentions a beagle
    recency, bm25 = RecencySystem(), BM25System()
    for system in (recency, bm25):
        system.ingest("s", list(c.turns))
    newest = recency.slice("s", query, 40, c.now)
    assert newest.items[-1].source_refs == ("D2:3",)
    assert ("D1:1",) not in [i.source_refs for i in newest.items]
    ranked = bm25.slice("s", query, 40, c.now)
    assert ranked.items and ranked.items[0].source_refs == ("D1:1",)


def test_oracle_in_p_mode_only_serves_its_subjects_turns(tmp_path: Path) -> None:
    (c,) = load_locomo(write_locomo(tmp_path / "l.json"), audit_path=None)
    oracle = OracleSystem()
    for key, turns in subjects_for_mode(c, "P-both").items():
        oracle.ingest(key, turns)
    oracle.set_gold("conv-26/Alice", "q", ["D2:3", "D1:1"])
    sl = oracle.slice("conv-26/Alice", "q", 1000, c.now)
    assert [i.source_refs for i in sl.items] == [("D1:1",)]
    assert oracle.slice("conv-26/Alice", "other question", 1000, c.now).text == ""


def test_main_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_locomo(tmp_path / "locomo.json")
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "--data",
                str(data),
                "--out",
                str(out),
                "--systems",
                "recency,bm25",
                "--budgets",
                "64,128",
                "--modes",
                "S",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"recency", "bm25"}
    assert set(report["results"]["bm25"]["S"]) == {"64", "128"}
    assert "LoCoMo-ER@B" in capsys.readouterr().out


def test_unknown_mode_and_system_are_rejected(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "locomo.json")
    with pytest.raises(ValueError, match="unknown mode"):
        run_locomo(data, None, baseline_factories(["bm25"]), budgets=[64], modes=["X"])
    with pytest.raises(ValueError, match="unknown baseline"):
        baseline_factories(["bm26"])
