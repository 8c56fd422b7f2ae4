"""The fidelity harness (SPEC §3, table 2) on small synthetic inputs, on both backends.

The real persona and LoCoMo files are non-commercial and stay out of the repository:
the sentences and conversation here are written for these tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.fidelity_bench import (
    FacadeDeployment,
    HeldItem,
    gate_failures,
    held_items,
    measure_fabrication,
    near_duplicate,
    persona_turns,
    run_personas,
    run_provenance,
    run_table2,
    tokens_at_recall,
)
from tests.bench.synthetic import hashed_embedder, locomo_conversation, write_locomo
from tests.conftest import Backend
from uprof.settings import Settings

PERSONAS = {
    "test": [
        {
            "Speaker 1": [
                "I am vegetarian.",
                "I live in Porto with my two cats.",
                "I work as a nurse at a children's hospital.",
                "i am vegetarian",
            ],
            "Speaker 2": [
                "I live in Lisbon.",
                "I am vegetarian.",
                "My favorite band is the Beatles.",
            ],
        },
        {
            "Speaker 1": ["I play the cello in an orchestra.", "I have a dog named Miso."],
            "Speaker 2": ["I am allergic to peanuts.", "I want to run a marathon next year."],
        },
    ]
}


def _quiet(_: str) -> None:
    return None


@pytest.fixture
def deployment(backend: Backend) -> Iterator[FacadeDeployment]:
    settings = Settings(
        data_dir=backend.data_dir / "data",
        database_url=backend.url if backend.kind == "postgres" else None,
        embedder="hashing",  # type: ignore[arg-type]
    )
    dep = FacadeDeployment(settings)
    try:
        yield dep
    finally:
        dep.close()


@pytest.fixture
def personas_file(tmp_path: Path) -> Path:
    path = tmp_path / "personas.json"
    path.write_text(json.dumps(PERSONAS), encoding="utf-8")
    return path


def test_personas_are_preserved_isolated_and_not_fabricated(
    deployment: FacadeDeployment, personas_file: Path
) -> None:
    result = run_personas(deployment, personas_file, "test", None, _quiet)
    assert result["sentences"] == 11
    assert result["exact_capture"] == 1.0
    assert result["exact_in_memory"] == 1.0
    assert result["items_leaked_from_other_subject"] == 0
    assert result["slice_probes"] == 4
    assert result["slices_with_other_subject_text"] == 0
    assert result["attributes_citing_other_subject"] == 0
    assert result["duplicate_attribute_groups_within_subject"] == 0
    # "I am vegetarian." said twice states one diet: one attribute, two pointers.
    assert result["near_duplicate_pairs_within_subject_with_attributes"] >= 1
    assert (
        result["near_duplicate_pairs_merged"]
        == (result["near_duplicate_pairs_within_subject_with_attributes"])
    )
    # The sentence both people said stays two attributes, one per subject.
    assert result["near_duplicate_sentences_across_pair"] == 2
    fab = result["fabrication"]
    assert fab["attributes"] > 0
    assert fab["fabricated_attributes"] == 0
    assert fab["rate"] == 0.0
    assert gate_failures({"personas": [result]}) == []
    broken = {**result, "fabrication": {**fab, "fabricated_attributes": 1}}
    assert gate_failures({"personas": [broken]}) == ["personas test: 1 fabricated attributes"]


def test_fabrication_metric_counts_a_dangling_pointer(deployment: FacadeDeployment) -> None:
    turns = persona_turns(0, "Speaker 1", ["I am vegetarian.", "I live in Porto."])
    deployment.ingest("alice", turns)
    items = held_items(deployment, "alice")
    attributes = [i for i in items if i.layer == "attribute"]
    assert attributes, "the rule extractor should derive attributes from these sentences"
    assert measure_fabrication(items).fabricated_attributes == 0
    # A copy of the computed set with one attribute whose only pointer resolves nowhere.
    forged = replace(attributes[0], item_id="forged", evidence=("no-such-capture",), resolved={})
    counted = measure_fabrication([*items, forged])
    assert counted.fabricated_attributes == 1
    assert counted.dangling_pointers == 1
    assert counted.rate == pytest.approx(1 / (len(attributes) + 1))
    # Marked inferred, the same item is not a fabrication (SPEC §3).
    inferred = replace(forged, provenance="inferred", evidence=())
    assert measure_fabrication([*items, inferred]).fabricated_attributes == 0


def test_a_pointer_into_another_subject_does_not_resolve(deployment: FacadeDeployment) -> None:
    """Evidence resolves only to the subject's own captures (the public API's check)."""
    deployment.ingest("alice", persona_turns(0, "Speaker 1", ["I am vegetarian."]))
    deployment.ingest("bob", persona_turns(1, "Speaker 2", ["I live in Lisbon."]))
    alice_ids = set(deployment.captures["alice"].values())
    bob_ids = set(deployment.captures["bob"].values())
    assert set(deployment.operator.evidence_captures("alice", alice_ids)) == alice_ids
    assert deployment.operator.evidence_captures("alice", bob_ids) == {}
    stolen = HeldItem(
        "alice", "attribute", "x", "home_location: Lisbon", "explicit", tuple(bob_ids), {}
    )
    assert measure_fabrication([stolen]).fabricated_attributes == 1


def _conversation_pair(tmp_path: Path) -> Path:
    second = locomo_conversation("conv-30")
    return write_locomo(tmp_path / "locomo.json", [locomo_conversation(), second])


def test_provenance_has_no_item_citing_the_other_speaker(
    deployment: FacadeDeployment, tmp_path: Path
) -> None:
    result = run_provenance(deployment, _conversation_pair(tmp_path), None, _quiet)
    assert result["subjects"] == 4
    assert result["silver_facts"] == 2
    assert result["recall_any_item"] == 1.0  # Alice's subject holds an item citing D1:1
    assert result["items"] > 0
    assert result["items_citing_other_speaker"] == 0
    assert result["pointers_into_other_subject"] == 0
    assert result["fabrication"]["fabricated_attributes"] == 0


def test_deletion_leaves_no_residue_by_question(backend: Backend, tmp_path: Path) -> None:
    settings = Settings(
        data_dir=backend.data_dir / "data",
        database_url=backend.url if backend.kind == "postgres" else None,
        embedder="hashing",  # type: ignore[arg-type]
    )
    result = run_table2(
        _conversation_pair(tmp_path),
        ["uprof", "bm25"],
        [64, 256],
        None,
        3,
        _quiet,
        deployment=lambda: FacadeDeployment(settings),
        embed=hashed_embedder(),
    )
    for name in ("uprof", "bm25"):
        deletion = result["systems"][name]["deletion"]
        assert deletion["questions"] == 6  # 3 per conversation, disjoint evidence
        assert deletion["by_variant"] == {"capture": 4, "item": 2}
        # The facts were there to be found before they were deleted...
        assert deletion["evidence_in_slice_before"] == 6
        # ...and neither the slice nor a derived item holds them afterwards.
        assert deletion["slices_with_residue"] == 0
        assert deletion["questions_with_derived_residue"] == 0
    fab = result["systems"]["uprof"]["fabrication"]
    assert fab["attributes"] > 0 and fab["fabricated_attributes"] == 0
    assert gate_failures({"table2": result}) == []


def test_tokens_at_recall_interpolates_and_flags_bounds() -> None:
    curve = [(250.0, 0.4), (1000.0, 0.6), (4000.0, 0.8)]
    assert tokens_at_recall(curve, 0.5) == (625.0, False)
    assert tokens_at_recall(curve, 0.3) == (250.0, True)
    tokens, bound = tokens_at_recall(curve, 0.9)
    assert tokens != tokens and not bound  # NaN: never reached


def test_near_duplicate() -> None:
    assert near_duplicate("I am vegetarian.", "i am vegetarian")
    assert not near_duplicate("I live in Porto.", "I live in Lisbon.")
