"""Small synthetic inputs in the LoCoMo and PrefEval schemas.

The real benchmark data is non-commercial and never enters the repository, so the
tests build look-alike files here, including the evidence quirks the real file has.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def locomo_conversation(sample_id: str = "conv-26") -> dict[str, Any]:
    """Two speakers, two sessions with turns, one date-only session, quirky evidence."""
    session_1 = [
        {
            "speaker": "Alice",
            "dia_id": "D1:1",
            "text": "I adopted a beagle called Rufus last week.",
        },
        {
            "speaker": "Bob",
            "dia_id": "D1:2",
            "text": "Congrats! I am training for the Berlin marathon.",
        },
        {
            "speaker": "Alice",
            "dia_id": "D1:3",
            "text": "Look at him sleeping.",
            "img_url": ["http://example.invalid/x.jpg"],
            "blip_caption": "a photo of a dog on a couch",
        },
        {"speaker": "Bob", "dia_id": "D1:4", "text": "So cute. My sister Carla lives in Lisbon."},
    ]
    session_2 = [
        {
            "speaker": "Bob",
            "dia_id": "D2:1",
            "text": "The marathon went well, I finished in four hours.",
        },
        {"speaker": "Alice", "dia_id": "D2:2", "text": "Rufus chewed my running shoes yesterday."},
        {"speaker": "Bob", "dia_id": "D2:3", "text": "Carla is visiting from Lisbon next month."},
    ]
    qa = [
        {
            "question": "What is the name of Alice's dog?",
            "answer": "Rufus",
            "evidence": ["D1:1"],
            "category": 4,
        },
        # "D1:1; D2:2" in one string: split on ';' and whitespace.
        {
            "question": "What did Alice's dog chew?",
            "answer": "shoes",
            "evidence": ["D1:1; D2:2"],
            "category": 1,
        },
        # "D:2:1" and a zero-padded turn number "D1:02".
        {
            "question": "How long did Bob's marathon take?",
            "answer": "4h",
            "evidence": ["D:2:1", "D1:02"],
            "category": 2,
        },
        # Ids that do not exist are dropped; "D" alone is not an id.
        {
            "question": "Where does Carla live?",
            "answer": "Lisbon",
            "evidence": ["D9:9", "D", "D1:4"],
            "category": 3,
        },
        # Nothing left after normalisation: skipped.
        {
            "question": "What colour is the couch?",
            "answer": "grey",
            "evidence": ["D7:1"],
            "category": 3,
        },
        # No evidence at all: skipped.
        {"question": "Would Bob enjoy hiking?", "answer": "likely", "evidence": [], "category": 3},
        # Category 5 is never scored.
        {
            "question": "What is Bob's dog called?",
            "adversarial_answer": "Rufus",
            "evidence": ["D1:1"],
            "category": 5,
        },
        # Duplicates collapse; evidence spans both speakers (for the P-mode ceiling).
        {
            "question": "Who is visiting from Lisbon?",
            "answer": "Carla",
            "evidence": ["D2:3", "D2:3", "D1:4"],
            "category": 4,
        },
    ]
    return {
        "sample_id": sample_id,
        "conversation": {
            "speaker_a": "Alice",
            "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": session_1,
            "session_2_date_time": "10:04 am on 12 June, 2023",
            "session_2": session_2,
            # A date key with no session: must be ignored, also for "now".
            "session_3_date_time": "9:00 am on 1 July, 2023",
        },
        "qa": qa,
        "observation": {
            "session_1_observation": {"Alice": [["Alice has a dog named Rufus", "D1:1"]]}
        },
        "session_summary": {"session_1_summary": "Alice adopted Rufus. Bob trains."},
        "event_summary": {"events_session_1": {"Alice": ["adopts a dog"], "date": "8 May, 2023"}},
    }


def write_locomo(path: Path, conversations: list[dict[str, Any]] | None = None) -> Path:
    """Write a locomo10-format file and return its path."""
    path.write_text(json.dumps(conversations or [locomo_conversation()]), encoding="utf-8")
    return path


PREF_TOPICS: dict[str, list[tuple[str, str]]] = {
    "travel_hotel": [
        ("I only stay in hotels that allow dogs.", "Where should I stay in Rome?"),
        ("I avoid hotels without a gym.", "Can you suggest a hotel in Oslo?"),
        ("I prefer boutique hotels over chains.", "Which hotel in Paris do you recommend?"),
    ],
    "lifestyle_dietary": [
        ("I am strictly vegan.", "What should I cook tonight?"),
        ("I dislike spicy food.", "Which curry should I order?"),
        ("I avoid gluten entirely.", "Can you recommend a bakery?"),
    ],
    "entertain_games": [
        ("I dislike games with pixel art graphics.", "Which indie game should I play next?"),
        ("I only play cooperative games.", "Suggest a board game for Saturday."),
        ("I never play horror games.", "What game fits a rainy evening?"),
    ],
}


def write_prefeval(folder: Path, topics: dict[str, list[tuple[str, str]]] | None = None) -> Path:
    """Write PrefEval topic files into folder/explicit_preference; return that folder."""
    target = folder / "explicit_preference"
    target.mkdir(parents=True, exist_ok=True)
    for topic, pairs in (topics or PREF_TOPICS).items():
        items = [{"preference": p, "question": q, "explanation": "..."} for p, q in pairs]
        (target / f"{topic}.json").write_text(json.dumps(items), encoding="utf-8")
    return target


def hashed_embedder(dim: int = 64):  # type: ignore[no-untyped-def]
    """A fake embedder: bag of lower-cased words hashed into dim buckets.

    Deterministic (no Python hash randomisation), so identical texts embed
    identically and word overlap means cosine similarity.
    """
    import zlib

    def embed(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, zlib.crc32(word.strip(".,!?").encode()) % dim] += 1.0
        return out

    return embed
