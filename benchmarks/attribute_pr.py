"""Attribute precision and recall against hand labels of MSC persona sentences.

Run ``uprof bench attributes --split train`` while developing and ``--split test`` for
the figure (``python -m benchmarks.attribute_pr`` does the same).

The labels (``benchmarks/labels/msc_attributes.json``) name each sentence by its
position in ``msc_personas_all.json`` and hold what a careful reader records about the
speaker (guide: ``docs/extraction-labels.md``); the sentences themselves are read in
place from the data folder and never copied into the repository.

Each sentence is captured alone, as the speaker's own turn, and run through the
extractor. A predicted attribute *matches* a label when

1. the attribute keys are equal (so the categories are too; ``likes`` and ``dislikes``
   are both ``preference`` but never match each other),
2. the polarity is equal (a negated proposal matches only a ``"not"`` label), and
3. the values match after normalisation (:func:`value_terms`): the content words of
   one, lemmatised, are all among the content words of the other, e.g. "country
   music" matches "listening to country music" and "3 kids" matches "three children".

precision = predictions that match some label / predictions;
recall = labels matched by some prediction / labels. Per category and overall (micro).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from domain.values import ATTRIBUTE_KEYS, AttributeProposal, CapturedInteraction, Interaction
from uprof.ports import Extractor

LABELS_PATH = Path(__file__).parent / "labels" / "msc_attributes.json"
DEFAULT_DATA = Path("../shared/bench/data/msc_personas_all.json")
#: The offline targets of issue 16 for the default (rule) extractor.
TARGET_PRECISION = 0.90
TARGET_RECALL = 0.60

_AT = datetime(2025, 3, 12, 15, 0, tzinfo=UTC)

# --- Value normalisation (the matching rule) ---------------------------------------------

_WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
#: Words that carry no content in a value ("the colour purple", "my favourite food").
_STOP = frozenset(
    """
    a an the my our your some any all of to on in for with and or at by from named called
    favorite favourite fave colour color food thing things i me really very
    """.split()
)
#: Same concept, different word: only for matching, never for storage.
_SYNONYMS = {
    "dad": "father",
    "daddy": "father",
    "mom": "mother",
    "mum": "mother",
    "mommy": "mother",
    "kid": "child",
    "grandkid": "grandchild",
    "wife": "spouse",
    "husband": "spouse",
    "favorite": "favourite",
    "travelling": "travel",
    "traveling": "travel",
}
_NUMBERS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve".split()
    )
}
_IRREGULAR = {
    "children": "child",
    "grandchildren": "grandchild",
    "people": "person",
    "men": "man",
    "women": "woman",
    "mice": "mouse",
    "geese": "goose",
    "teeth": "tooth",
    "feet": "foot",
}
_FREE_RE = re.compile(r"\b(?:no\s+([a-z]+)|([a-z]+)[\s-]free)\b")


def _lemma(word: str) -> str:
    """A deliberately small English lemmatiser, stable across library versions."""
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if len(word) > 5 and word.endswith("ing"):
        stem = word[:-3]
        if len(stem) > 2 and stem[-1] == stem[-2] and stem[-1] not in "lsz":
            stem = stem[:-1]  # running -> run
        return stem
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def value_terms(value: str) -> frozenset[str]:
    """The content words of a value, lower-cased, lemmatised and mapped to one synonym."""
    text = value.lower().replace("\u2019", "'")
    text = _FREE_RE.sub(lambda m: f"{m.group(1) or m.group(2)}free", text)
    terms = set()
    for raw in _WORD_RE.findall(text):
        word = _NUMBERS.get(raw, raw)
        word = _SYNONYMS.get(word, word)
        if word in _STOP:
            continue
        lemma = _lemma(word)
        terms.add(_SYNONYMS.get(lemma, _stem_e(lemma)))
    return frozenset(terms)


def _stem_e(word: str) -> str:
    """Drop a final silent "e" so "bike" and "biking" (-> "bik") meet."""
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


@dataclass(frozen=True)
class Fact:
    """One attribute: a label, or a prediction reduced to what is compared."""

    key: str
    value: str
    negated: bool = False

    @property
    def category(self) -> str:
        return ATTRIBUTE_KEYS[self.key].category if self.key in ATTRIBUTE_KEYS else self.key

    def matches(self, other: Fact) -> bool:
        if self.key != other.key or self.negated != other.negated:
            return False
        mine, theirs = value_terms(self.value), value_terms(other.value)
        return bool(mine) and bool(theirs) and (mine <= theirs or theirs <= mine)


# --- Data ----------------------------------------------------------------------------------


def load_labels(split: str, path: Path = LABELS_PATH) -> dict[str, list[Fact]]:
    """The labels of one split, by sentence id."""
    raw = json.loads(path.read_text(encoding="utf-8"))["labels"][split]
    return {
        sid: [Fact(item[0], item[1], len(item) > 2 and item[2] == "not") for item in items]
        for sid, items in raw.items()
    }


def load_sentences(ids: Iterable[str], data: Path = DEFAULT_DATA) -> dict[str, str]:
    """Resolve ``split:item:speaker:sentence`` ids against the persona file, read in place."""
    personas = json.loads(data.read_text(encoding="utf-8"))
    out = {}
    for sid in ids:
        split, item, speaker, index = sid.split(":")
        out[sid] = personas[split][int(item)][f"Speaker {speaker}"][int(index)]
    return out


def capture_of(sid: str, text: str) -> CapturedInteraction:
    """The sentence as its speaker's own captured turn."""
    return CapturedInteraction(
        capture_id=f"msc-{sid}",
        interaction=Interaction(
            app_id="bench", agent_id="bench", occurred_at=_AT, user_input=text, actor="subject"
        ),
    )


def predicted_facts(extractor: Extractor, sid: str, text: str) -> list[Fact]:
    batch = extractor.extract(capture_of(sid, text))
    return [
        Fact(p.key, p.value, p.negated) for p in batch.proposals if isinstance(p, AttributeProposal)
    ]


# --- Scoring -------------------------------------------------------------------------------


@dataclass
class Tally:
    labels: int = 0
    found: int = 0  # labels matched by a prediction
    predictions: int = 0
    correct: int = 0  # predictions matching a label

    @property
    def precision(self) -> float | None:
        return self.correct / self.predictions if self.predictions else None

    @property
    def recall(self) -> float | None:
        return self.found / self.labels if self.labels else None


@dataclass
class Result:
    extractor: str
    split: str
    sentences: int
    overall: Tally = field(default_factory=Tally)
    by_category: dict[str, Tally] = field(default_factory=dict)
    errors: list[dict[str, object]] = field(default_factory=list)
    seconds: float = 0.0
    failures: int = 0

    def to_json(self) -> dict[str, object]:
        def row(t: Tally) -> dict[str, object]:
            return {
                "labels": t.labels,
                "found": t.found,
                "predictions": t.predictions,
                "correct": t.correct,
                "precision": _round(t.precision),
                "recall": _round(t.recall),
            }

        return {
            "extractor": self.extractor,
            "split": self.split,
            "sentences": self.sentences,
            "overall": row(self.overall),
            "by_category": {c: row(t) for c, t in sorted(self.by_category.items())},
            "extract_ms_per_sentence": round(1000 * self.seconds / max(self.sentences, 1), 3),
            "failures": self.failures,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def score(
    extractor: Extractor,
    labels: dict[str, list[Fact]],
    sentences: dict[str, str],
    *,
    name: str = "",
    split: str = "",
) -> Result:
    """Run the extractor on every labelled sentence and tally matches per category."""
    result = Result(name or getattr(extractor, "name", "extractor"), split, len(labels))
    for sid, gold in labels.items():
        start = time.perf_counter()
        try:
            predicted = predicted_facts(extractor, sid, sentences[sid])
        except Exception as exc:  # an endpoint failure: counted, the sentence predicts nothing
            result.failures += 1
            predicted = []
            result.errors.append({"id": sid, "error": str(exc)[:200]})
        result.seconds += time.perf_counter() - start
        for fact in gold:
            hit = any(fact.matches(p) for p in predicted)
            for t in (result.overall, result.by_category.setdefault(fact.category, Tally())):
                t.labels += 1
                t.found += hit
            if not hit:
                result.errors.append({"id": sid, "missed": _show(fact)})
        for p in predicted:
            ok = any(p.matches(g) for g in gold)
            for t in (result.overall, result.by_category.setdefault(p.category, Tally())):
                t.predictions += 1
                t.correct += ok
            if not ok:
                result.errors.append({"id": sid, "wrong": _show(p)})
    return result


def _show(f: Fact) -> str:
    return f"{f.key}={'not ' if f.negated else ''}{f.value}"


# --- Extractors and report ----------------------------------------------------------------


def rule_extractor() -> Extractor:
    from uprof.adapters.extraction import RuleBasedExtractor

    return RuleBasedExtractor()


def llm_extractor() -> tuple[Extractor | None, str]:
    """The LLM extractor from the settings when one is configured, else (None, why not).

    Configured means ``UPROF_EXTRACTOR=llm`` (with ``UPROF_LLM_BASE_URL`` and
    ``UPROF_LLM_MODEL``). No rule fallback: its figure must be the model's own.
    """
    from uprof.adapters.extraction import OpenAICompatibleExtractor
    from uprof.settings import Settings

    settings = Settings()
    if settings.extractor != "llm":
        return None, "no OpenAI-compatible endpoint configured (set UPROF_EXTRACTOR=llm)"
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    extractor = OpenAICompatibleExtractor(
        base_url=settings.llm_base_url,
        model=settings.llm_model,
        api_key=key,
        timeout_s=settings.llm_timeout_s,
    )
    return extractor, f"{settings.llm_model} at {settings.llm_base_url}"


def render(result: Result) -> str:
    """A markdown table, one row per category and the overall figure."""
    lines = [
        f"**{result.extractor}**, {result.split} split, {result.sentences} sentences"
        + (f", {result.failures} failed calls" if result.failures else ""),
        "",
        "| category | labels | predictions | precision | recall |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = [*sorted(result.by_category.items()), ("**all**", result.overall)]
    for name, t in rows:
        p = "-" if t.precision is None else f"{t.precision:.3f}"
        r = "-" if t.recall is None else f"{t.recall:.3f}"
        lines.append(f"| {name} | {t.labels} | {t.predictions} | {p} | {r} |")
    return "\n".join(lines)


def run(
    split: str,
    *,
    data: Path = DEFAULT_DATA,
    out: Path | None = None,
    with_llm: bool = True,
    show_errors: bool = False,
    echo: Callable[[str], None] = print,
) -> list[Result]:
    if split not in ("train", "test"):
        raise ValueError("split must be train or test")
    labels = load_labels(split)
    sentences = load_sentences(labels, data)
    results = [score(rule_extractor(), labels, sentences, name="rules", split=split)]
    if with_llm:
        llm, about = llm_extractor()
        if llm is None:
            echo(f"LLM extractor: skipped, {about}.")
        else:
            echo(f"LLM extractor: {about}")
            results.append(score(llm, labels, sentences, name=f"llm ({about})", split=split))
    for r in results:
        echo(render(r))
        echo("")
        if show_errors:
            for e in r.errors:
                echo(f"  {e}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "split": split,
            "matching": "key and polarity equal, content lemmas of one value within the other's",
            "targets": {"precision": TARGET_PRECISION, "recall": TARGET_RECALL},
            "results": [r.to_json() for r in results],
        }
        out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return results


def speaker_attribution(locomo: Path, echo: Callable[[str], None] = print) -> dict[str, int]:
    """Attributes the rule extractor proposes over LoCoMo turns for the subject speaker A.

    Every turn of every conversation is captured as A's subject would get it in mode S:
    once without ``subject_actor`` (any actor is taken to be the subject) and once with
    ``subject_actor`` = A. Counts explicit and reported attributes from A's and B's turns.
    """
    from uprof.adapters.extraction.speaker import SUBJECT_ACTOR

    extractor = rule_extractor()
    counts: dict[str, int] = {}
    for conv in json.loads(locomo.read_text(encoding="utf-8")):
        talk = conv["conversation"]
        a = talk["speaker_a"]
        for name, turns in talk.items():
            if not name.startswith("session_") or not isinstance(turns, list):
                continue
            for t in turns:
                who = "A" if t["speaker"] == a else "B"
                for told, context in (("without", ()), ("with", ((SUBJECT_ACTOR, a),))):
                    c = CapturedInteraction(
                        "locomo",
                        Interaction(
                            app_id="bench",
                            agent_id="bench",
                            occurred_at=_AT,
                            user_input=t["text"],
                            actor=t["speaker"],
                            context=context,
                        ),
                    )
                    for p in extractor.extract(c).proposals:
                        if isinstance(p, AttributeProposal):
                            kind = "reported" if p.reported else "explicit"
                            key = f"{told} subject_actor, {who}'s turns, {kind}"
                            counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        echo(f"{key}: {n}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="train", choices=["train", "test"])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--errors", action="store_true", help="list every miss and wrong item")
    parser.add_argument("--no-llm", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run(args.split, data=args.data, out=args.out, with_llm=not args.no_llm, show_errors=args.errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
