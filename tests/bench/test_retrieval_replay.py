"""The ablation replay: fixed halves, users drawn as the harness draws them, summaries."""

from __future__ import annotations

import json
import pickle
import random
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from benchmarks.evidence_misses import memory_sentences, proper_names, rank_bucket
from benchmarks.prefeval import SEED, load_prefeval, user_events
from benchmarks.retrieval_replay import (
    SliceInputs,
    TextVectors,
    half_of,
    load_inputs,
    markdown_tables,
    merged_reports,
    parse_variant,
    pref_users,
    recorded_questions_by_conversation,
    slice_times,
    summarise,
    worst_fall,
)
from benchmarks.slice_form_gap import first_fit
from tests.bench.synthetic import write_prefeval
from uprof.adapters.embeddings import HashingEmbedder


def test_halves_are_fixed_by_the_hash_of_the_case_id() -> None:
    # Pinned: a change of rule would silently move cases between tune and check.
    tune = ["conv-26", "conv-30", "conv-43", "conv-50"]
    check = ["conv-42", "conv-44", "conv-47", "conv-48"]
    assert [half_of(c) for c in tune] == ["tune"] * 4
    assert [half_of(c) for c in check] == ["check"] * 4
    assert half_of("entertain_shows") == "check" and half_of("travel_hotel") == "tune"


def test_users_are_drawn_exactly_as_the_harness_draws_them(tmp_path: Path) -> None:
    items = load_prefeval(write_prefeval(tmp_path))
    rng = random.Random(SEED)
    expected = [user_events(user, items, 3, rng) for user in items]
    assert [events for _, events in pref_users(items, 3)] == expected


def test_summaries_split_rows_by_half_and_keep_the_full_set() -> None:
    rows = [
        {"case": "conv-26", "category": 1, "B": 256, "strict": 1.0},
        {"case": "conv-42", "category": 1, "B": 256, "strict": 0.0},
    ]
    pref = [{"case": "travel_hotel", "N": 50, "B": 256, "hit": True}]
    got = summarise(rows, pref)
    assert got["tune"]["locomo"]["B256"]["all"] == 1.0
    assert got["check"]["locomo"]["B256"]["all"] == 0.0
    assert got["full"]["locomo"]["B256"]["all"] == 0.5
    assert got["tune"]["prefeval"]["N50_B256"]["pr"] == 1.0
    assert got["check"]["prefeval"] == {}


def test_variants_are_named_or_explicit_overrides() -> None:
    assert parse_variant("no-bridges") == ("no-bridges", {"bridge_weight": 0.0})
    assert parse_variant("x=sharpness:2;mmr_penalty:0.25") == (
        "x",
        {"sharpness": 2, "mmr_penalty": 0.25},
    )
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variant("nonsense")


def test_slice_times_pair_each_slice_with_the_defaults_same_slice() -> None:
    got = slice_times({"locomo": [0.003, 0.001, 0.002], "prefeval": []}, {"locomo": [0.001] * 3})
    assert got["locomo"]["p50"] == pytest.approx(2.0)
    assert got["locomo"]["p50_added_vs_default"] == pytest.approx(1.0)
    assert "prefeval" not in got
    assert "p50_added_vs_default" not in slice_times({"locomo": [0.001]}, None)["locomo"]


def _result(cat3_at_256: float) -> dict[str, object]:
    row = {"all": 0.5, "cat1": 0.1, "cat2": 0.8, "cat3": 0.5, "cat4": 0.9}
    return {
        "locomo": {
            "B256": {**row, "cat3": cat3_at_256},
            "B1024": dict(row),
            "B2048": {**row, "cat1": 0.12},
        },
        "prefeval": {k: {"pr": 0.9} for k in ("N50_B128", "N50_B256", "N200_B128")},
    }


def test_worst_fall_is_the_largest_category_drop_at_any_budget() -> None:
    main, variant = _result(0.5), _result(0.45)
    variant["locomo"]["B2048"]["cat1"] = 0.11  # type: ignore[index]
    assert worst_fall(variant, main) == (pytest.approx(-0.05), 3, 256)


def test_markdown_tables_mark_main_and_leave_baselines_without_a_delta() -> None:
    report = {
        "results": {
            name: {part: _result(0.5) for part in ("tune", "check", "full")}
            for name in ("bm25", "default", "x")
        }
    }
    text = markdown_tables(report, {"bm25": "BM25", "default": "main", "x": "x on"})
    assert text.count("| **main** |") == 3
    assert "| BM25 | 0.500 / 0.100 |" in text
    assert "+0.000 (cat 1, 256)" in text


def test_a_recording_written_by_the_module_run_as_main_loads_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python -m benchmarks.retrieval_replay --record` pickles SliceInputs as __main__'s;
    # another tool (benchmarks.slice_form_gap) must still read the file.
    inputs = SliceInputs(
        query="q",
        memories=(),
        memory_vectors=None,
        attributes=(),
        attribute_vectors=None,
        intents=(),
        intent_vectors=None,
        query_vector=None,
        now=datetime(2024, 1, 1, tzinfo=UTC),
    )
    with monkeypatch.context() as as_main:  # the class as the recorder's process saw it
        as_main.setattr(SliceInputs, "__module__", "__main__")
        as_main.setattr(sys.modules["__main__"], "SliceInputs", SliceInputs, raising=False)
        data = pickle.dumps({"prefeval": {"ref": inputs}})
    assert b"__main__" in data
    with pytest.raises(AttributeError):
        pickle.loads(data)
    path = tmp_path / "rec.pkl"
    path.write_bytes(data)
    assert load_inputs(path) == {"prefeval": {"ref": inputs}}


def test_form_gap_first_fit_takes_rows_in_rank_order_while_they_fit() -> None:
    # Costs by row; order is the ranking. Row 2 (cost 5) no longer fits after 0 and 3.
    costs = [4, 1, 5, 3]
    assert first_fit([0, 3, 2, 1], costs, budget=9) == {0, 3, 1}
    assert first_fit([2, 0], costs, budget=9) == {2, 0}
    assert first_fit([0], costs, budget=3) == set()


def test_evidence_misses_reads_names_inside_sentences_only() -> None:
    got = proper_names("Thanks, Mel! This is from my home country, Sweden. Yes, Harry Potter.")
    assert got == {"mel", "sweden", "harri", "potter"}
    # A capital that starts a sentence, a quote or a bracket is no name.
    assert proper_names('Great. Really! "Wow" [Photo: a dog]') == set()


def test_evidence_misses_bucket_ranks_by_fifty_inside_the_pool() -> None:
    assert rank_bucket(0, 200) == "pool 0-49"
    assert rank_bucket(149, 200) == "pool 100-149"
    assert rank_bucket(199, 200) == "pool 150-199"
    assert rank_bucket(200, 200) == "outside pool"
    assert rank_bucket(30, 40) == "pool 0-39"


def test_evidence_misses_counts_a_turns_sentences_as_the_extractor_splits_them() -> None:
    assert memory_sentences("First part. Second part!  Third? Dr. Who came") == [
        "First part.",
        "Second part!",
        "Third?",
        "Dr. Who came",
    ]
    assert memory_sentences("One sentence, with a comma") == ["One sentence, with a comma"]


def test_the_full_split_of_two_half_runs_equals_the_whole_runs() -> None:
    rows = [
        {"case": case, "category": cat, "B": b, "strict": float((i * 7 + b) % 3 == 0)}
        for i, (case, cat) in enumerate(
            [("conv-26", 1), ("conv-26", 2), ("conv-42", 1), ("conv-42", 4), ("conv-30", 1)]
        )
        for b in (256, 2048)
    ]
    pref = [
        {"case": topic, "N": 50, "B": 256, "hit": i % 2 == 0}
        for i, topic in enumerate(["travel_hotel", "travel_hotel", "lifestyle_fit", "x_y"])
    ]
    whole = summarise(rows, pref)
    tune = summarise([r for r in rows if half_of(r["case"]) == "tune"], pref, ("tune",))
    check = summarise([r for r in rows if half_of(r["case"]) == "check"], pref, ("check",))
    assert set(tune) == {"tune"} and set(check) == {"check"}
    merged = merged_reports([{"results": {"x": tune}}, {"results": {"x": check}}])["results"]["x"]
    for part in ("tune", "check"):  # NaN for an empty category: compared as text
        assert json.dumps(merged[part], sort_keys=True) == json.dumps(whole[part], sort_keys=True)
    for key, row in whole["full"]["locomo"].items():
        for field, value in row.items():
            assert merged["full"]["locomo"][key][field] == pytest.approx(value, nan_ok=True)
    for key, row in whole["full"]["prefeval"].items():
        assert merged["full"]["prefeval"][key]["pr"] == pytest.approx(row["pr"])


def test_markdown_tables_print_only_the_halves_a_report_holds() -> None:
    report = {"results": {name: {"tune": _result(0.5)} for name in ("default", "x")}}
    text = markdown_tables(report, {"default": "main", "x": "x on"})
    assert text.startswith("tune:") and "check:" not in text and "full:" not in text


def test_the_diagnosis_walk_gives_each_conversations_category_questions_one_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # miss_causes and evidence_misses walk the recording alike: conversations of one half,
    # their questions of one category with their recorded inputs, one index each, built
    # from the first question's memories.
    import benchmarks.retrieval_replay as replay

    data = Path(__file__).resolve().parents[2] / ".." / "shared" / "bench" / "data"
    if not (data / "locomo_dev.json").is_file():  # as tests/bench/test_reproduction.py
        pytest.skip("benchmark data not beside checkout")
    built: list[object] = []

    def index(memories: object, vectors: object, counter: object) -> object:
        built.append(memories)
        return ("index", memories)

    class Recorded(dict):  # type: ignore[type-arg]
        def __missing__(self, key: tuple[str, int]) -> object:
            return type("Got", (), {"memories": key, "memory_vectors": None})()

    monkeypatch.setattr(replay, "_index", index)
    walked = list(recorded_questions_by_conversation(data, Recorded(), "tune", 1, None))
    assert [conv.sample_id for conv, _, _ in walked] == ["conv-26", "conv-30", "conv-43", "conv-50"]
    for conv, asked, built_index in walked:
        assert asked and all(q.category == 1 for q, _ in asked)
        assert [got.memories for _, got in asked] == [
            (conv.sample_id, q.qa_index) for q, _ in asked
        ]
        assert built_index == ("index", asked[0][1].memories)
    assert len(built) == len(walked)


def test_texts_are_embedded_once_each_in_one_batch_per_call() -> None:
    hashing = HashingEmbedder(dimension=16)
    calls: list[list[str]] = []

    def embed(texts: Sequence[str]) -> np.ndarray:
        calls.append(list(texts))
        return hashing.embed(texts)

    vectors = TextVectors(embed)
    assert vectors([]) is None and not calls
    got = vectors(["hobbies", "causes", "hobbies"])
    assert calls == [["hobbies", "causes"]]  # one batch, each text once
    assert got is not None and np.allclose(got, hashing.embed(["hobbies", "causes", "hobbies"]))
    # A later call (another variant, another budget) embeds only what is new.
    again = vectors(["causes", "support"])
    assert calls == [["hobbies", "causes"], ["support"]]
    assert again is not None and np.allclose(again, hashing.embed(["causes", "support"]))
    assert vectors.texts == 3 and vectors.calls == 2 and vectors.seconds >= 0
