"""LoCoMo evidence recall at a token budget (LoCoMo-ER@B), SPEC section 1.

For every question of categories 1-4, each system is asked for a slice of the
conversation's subject at budget B; the slice is scored on whether it contains the
gold evidence turns (verbatim text, or an item citing the turn among at most three
source turns). Over-budget slices score zero. Runs on the development split and,
unchanged, on the original 10-conversation file.

Usage::

    python -m benchmarks.locomo --data ../shared/bench/data/locomo_dev.json \\
        --out /tmp/locomo.json --systems recency,bm25,tfidf,embedding,oracle
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.baselines import (
    BASELINE_NAMES,
    baseline_factories,
    set_torch_threads,
    torch_thread_count,
)
from benchmarks.bench_common import (
    DEFAULT_DATA_DIR,
    BenchSlice,
    BenchSystem,
    BenchTurn,
    GoldAware,
    SystemFactory,
    count_tokens,
    mean,
    normalise_text,
    parse_locomo_datetime,
    percentile,
    render_dialogue_line,
    run_context,
    with_caption,
)

BUDGETS: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
MODES: tuple[str, ...] = ("S", "P-routed", "P-both")
CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)
# Derived credit only for concise items: a summary citing many turns earns nothing.
MAX_DERIVED_REFS = 3

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")
_EVIDENCE_ID = re.compile(r"D:?(\d+):0*(\d+)")


# ---------------------------------------------------------------- data model


@dataclass(frozen=True)
class Question:
    """One scored question with its normalised (and optionally audited) evidence."""

    sample_id: str
    qa_index: int
    question: str
    category: int
    evidence: tuple[str, ...]
    audited: tuple[str, ...] | None  # None: no audited evidence left for this question


@dataclass(frozen=True)
class Conversation:
    """A conversation as the harness needs it: turns to capture, texts to score."""

    sample_id: str
    speakers: tuple[str, str]
    turns: tuple[BenchTurn, ...]
    verbatim: Mapping[str, str]  # dia_id -> normalised turn text (caption-free form)
    verbatim_captioned: Mapping[str, str]  # dia_id -> normalised text with caption suffix
    questions: tuple[Question, ...]
    now: datetime  # last session's timestamp + 1 day

    @property
    def speaker_of(self) -> dict[str, str]:
        return {t.source_ref: t.actor for t in self.turns}


def session_numbers(conversation: Mapping[str, Any]) -> list[int]:
    """Numbers of sessions that have turns, ascending (date keys alone are ignored)."""
    found = []
    for key, value in conversation.items():
        match = _SESSION_KEY.fullmatch(key)
        if match and isinstance(value, list) and value:
            found.append(int(match.group(1)))
    return sorted(found)


def conversation_turns(conversation: Mapping[str, Any]) -> list[BenchTurn]:
    """Turns as captured events: session date + i seconds, caption appended."""
    turns: list[BenchTurn] = []
    for n in session_numbers(conversation):
        start = parse_locomo_datetime(conversation[f"session_{n}_date_time"])
        for i, raw in enumerate(conversation[f"session_{n}"]):
            turns.append(
                BenchTurn(
                    source_ref=raw["dia_id"],
                    actor=raw["speaker"],
                    content=with_caption(raw["text"], raw.get("blip_caption")),
                    occurred_at=start + timedelta(seconds=i),
                    session=n,
                )
            )
    return turns


def normalise_evidence(raw: Iterable[Any], known_ids: Iterable[str]) -> tuple[str, ...]:
    """SPEC normalisation: split on ``[;,\\s]+``, map ``D:?(\\d+):0*(\\d+)`` to
    ``D<int>:<int>``, drop unknown ids, de-duplicate keeping first-seen order."""
    known = set(known_ids)
    out: list[str] = []
    for entry in raw:
        for piece in _EVIDENCE_SPLIT.split(str(entry)):
            match = _EVIDENCE_ID.fullmatch(piece.strip())
            if not match:
                continue
            ref = f"D{int(match.group(1))}:{int(match.group(2))}"
            if ref in known and ref not in out:
                out.append(ref)
    return tuple(out)


def session_of_ref(ref: str) -> int:
    """Session number of a normalised ``D<s>:<t>`` id."""
    return int(ref[1:].split(":", 1)[0])


def load_audit(path: Path | None) -> dict[str, dict[str, Any]]:
    """``question_id -> record`` from locomo-audit/errors.json (empty if absent)."""
    if path is None or not path.exists():
        return {}
    return {rec["question_id"]: rec for rec in json.loads(path.read_text(encoding="utf-8"))}


_AUDIT_ID = re.compile(r"locomo_(\d+)_qa(\d+)")


def audit_positions(
    raw: Sequence[Mapping[str, Any]], audit: Mapping[str, Mapping[str, Any]]
) -> dict[str, int]:
    """``sample_id -> i`` of the audit's ``locomo_<i>_qa<j>`` ids, found from the data.

    The audit numbers conversations by their place in the original 10-conversation
    file, which a split withholding some conversations no longer shows. Each record
    repeats its question text, so a conversation's ``i`` is the one whose records
    match its ``qa`` list best (more matches than mismatches; its own position wins
    a tie). No list of ids is kept here, so the full file and any split both work;
    a conversation without a matching ``i`` simply gets no overlay.
    """
    questions: dict[int, list[tuple[int, str]]] = {}
    for qid, rec in audit.items():
        match = _AUDIT_ID.fullmatch(qid)
        if match:
            questions.setdefault(int(match.group(1)), []).append(
                (int(match.group(2)), str(rec.get("question", "")).strip())
            )
    out: dict[str, int] = {}
    for position, conv in enumerate(raw):
        texts = [str(qa.get("question", "")).strip() for qa in conv["qa"]]
        best: tuple[int, int] | None = None  # (net matches, -distance from position)
        for i, recs in questions.items():
            hits = sum(j < len(texts) and texts[j] == q for j, q in recs)
            net = hits - (len(recs) - hits)
            key = (net, -abs(i - position))
            if hits and net > 0 and (best is None or key > best):
                best, out[conv["sample_id"]] = key, i
    return out


def build_conversation(
    raw: Mapping[str, Any],
    conv_index: int | None,
    audit: Mapping[str, Mapping[str, Any]],
    categories: Sequence[int],
) -> Conversation:
    """Turn one JSON conversation into captured turns and scored questions.

    ``conv_index`` is the conversation's ``<i>`` in the audit ids (None: no overlay).
    """
    conv = raw["conversation"]
    turns = conversation_turns(conv)
    known = [t.source_ref for t in turns]
    sessions = session_numbers(conv)
    now = parse_locomo_datetime(conv[f"session_{sessions[-1]}_date_time"]) + timedelta(days=1)
    texts: dict[str, str] = {}
    captioned: dict[str, str] = {}
    for n in sessions:
        for t in conv[f"session_{n}"]:
            texts[t["dia_id"]] = normalise_text(t["text"])
            captioned[t["dia_id"]] = normalise_text(with_caption(t["text"], t.get("blip_caption")))
    questions: list[Question] = []
    for j, qa in enumerate(raw["qa"]):
        if qa.get("category") not in categories:
            continue
        evidence = normalise_evidence(qa.get("evidence", []), known)
        if not evidence:
            continue  # nothing to recall: the SPEC skips these
        audited: tuple[str, ...] | None = evidence
        record = audit.get(f"locomo_{conv_index}_qa{j}") if conv_index is not None else None
        # Guard against a mis-numbered overlay: the audit repeats the question text.
        if record is not None and record.get("question", "").strip() == qa["question"].strip():
            corrected = normalise_evidence(record.get("correct_evidence") or [], known)
            if set(corrected) != set(evidence):
                audited = corrected or None
        questions.append(
            Question(raw["sample_id"], j, qa["question"], int(qa["category"]), evidence, audited)
        )
    speakers = (conv["speaker_a"], conv["speaker_b"])
    return Conversation(
        raw["sample_id"], speakers, tuple(turns), texts, captioned, tuple(questions), now
    )


def load_locomo(
    data_path: Path,
    audit_path: Path | None = None,
    categories: Sequence[int] = CATEGORIES,
    sample_ids: Sequence[str] | None = None,
) -> list[Conversation]:
    """Load a locomo10-format file (any number of conversations)."""
    raw = json.loads(Path(data_path).read_text(encoding="utf-8"))
    audit = load_audit(audit_path)
    positions = audit_positions(raw, audit)
    convs = [
        build_conversation(item, positions.get(item["sample_id"]), audit, categories)
        for item in raw
    ]
    if sample_ids:
        convs = [c for c in convs if c.sample_id in set(sample_ids)]
    return convs


# ---------------------------------------------------------------- modes


def person_subject(sample_id: str, speaker: str) -> str:
    """Subject key of one person in mode P."""
    return f"{sample_id}/{speaker}"


def subjects_for_mode(conv: Conversation, mode: str) -> dict[str, list[BenchTurn]]:
    """Subjects to ingest: the whole conversation (S) or one per speaker (P)."""
    if mode == "S":
        return {conv.sample_id: list(conv.turns)}
    return {
        person_subject(conv.sample_id, sp): [t for t in conv.turns if t.actor == sp]
        for sp in conv.speakers
    }


def routed_speakers(question: str, speakers: Sequence[str]) -> list[str]:
    """Speakers whose first name occurs in the question as a whole word."""
    return [sp for sp in speakers if re.search(rf"\b{re.escape(sp)}\b", question)]


def query_plan(conv: Conversation, question: str, mode: str, budget: int) -> list[tuple[str, int]]:
    """(subject, budget) calls for one question.

    P-routed: the one named person at B; both or neither named, both at B/2 each.
    P-both: both at B/2 each. The two slices are handed over side by side, so the
    question's token count is the sum of theirs.
    """
    if mode == "S":
        return [(conv.sample_id, budget)]
    if mode == "P-routed":
        named = routed_speakers(question, conv.speakers)
        if len(named) == 1:
            return [(person_subject(conv.sample_id, named[0]), budget)]
    elif mode != "P-both":
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    half = budget // 2
    return [(person_subject(conv.sample_id, sp), half) for sp in conv.speakers]


# ---------------------------------------------------------------- scoring


@dataclass(frozen=True)
class Coverage:
    """Per-question metrics for one evidence set."""

    strict: float
    frac: float
    any: float
    session: float

    @staticmethod
    def zero() -> Coverage:
        return Coverage(0.0, 0.0, 0.0, 0.0)


def coverage(covered: set[str], evidence: Sequence[str]) -> Coverage:
    """strict / frac / any / session for a covered set against the evidence."""
    hits = [e in covered for e in evidence]
    sessions = {session_of_ref(e) for e in evidence}
    hit_sessions = {session_of_ref(e) for e, h in zip(evidence, hits, strict=True) if h}
    return Coverage(
        strict=float(all(hits)),
        frac=sum(hits) / len(evidence),
        any=float(any(hits)),
        session=len(hit_sessions) / len(sessions),
    )


def verbatim_covered(
    slice_texts: Sequence[str],
    refs: Iterable[str],
    texts: Mapping[str, str],
    captioned: Mapping[str, str],
) -> set[str]:
    """Refs whose normalised turn text is a substring of a normalised slice text.

    The caption suffix is optional, so the caption-free text is enough; only an
    empty turn text (which would match anything) falls back to the captioned form.
    """
    normalised = [normalise_text(t) for t in slice_texts if t]
    out: set[str] = set()
    for ref in refs:
        needle = texts.get(ref) or captioned.get(ref, "")
        if needle and any(needle in hay for hay in normalised):
            out.add(ref)
    return out


def derived_covered(slices: Sequence[BenchSlice], max_refs: int = MAX_DERIVED_REFS) -> set[str]:
    """Refs cited by some slice item that cites at most ``max_refs`` source turns."""
    out: set[str] = set()
    for sl in slices:
        for item in sl.items:
            refs = set(item.source_refs)
            if 0 < len(refs) <= max_refs:
                out |= refs
    return out


@dataclass(frozen=True)
class QuestionResult:
    """One row: a question answered by one system, in one mode, at one budget."""

    sample_id: str
    qa_index: int
    category: int
    budget: int
    mode: str
    system: str
    n_tokens: int
    over_budget: bool
    union: Coverage  # (a) verbatim or (b) derived
    verbatim: Coverage  # (a) only
    audited_union: Coverage | None
    audited_verbatim: Coverage | None
    latency_ms: float

    def row(self) -> dict[str, Any]:
        """The JSONL row (SPEC fields first, then the verbatim-only pair)."""
        return {
            "sample_id": self.sample_id,
            "qa_index": self.qa_index,
            "category": self.category,
            "B": self.budget,
            "mode": self.mode,
            "system": self.system,
            "n_tokens": self.n_tokens,
            "over_budget": self.over_budget,
            "strict": self.union.strict,
            "frac": self.union.frac,
            "any": self.union.any,
            "session": self.union.session,
            "verbatim_strict": self.verbatim.strict,
            "verbatim_frac": self.verbatim.frac,
        }


def score_question(
    conv: Conversation,
    q: Question,
    slices: Sequence[BenchSlice],
    budget: int,
) -> tuple[int, bool, Coverage, Coverage, Coverage | None, Coverage | None]:
    """Count tokens, apply the budget rule, then score both evidence sets.

    Returns (n_tokens, over_budget, union, verbatim, audited_union, audited_verbatim).
    """
    n_tokens = sum(count_tokens(s.text) for s in slices)
    if n_tokens > budget:
        zero = Coverage.zero()
        return (
            n_tokens,
            True,
            zero,
            zero,
            (zero if q.audited else None),
            (zero if q.audited else None),
        )
    refs = set(q.evidence) | set(q.audited or ())
    verbatim = verbatim_covered(
        [s.text for s in slices], refs, conv.verbatim, conv.verbatim_captioned
    )
    union = verbatim | derived_covered(slices)
    audited_u = coverage(union, q.audited) if q.audited else None
    audited_v = coverage(verbatim, q.audited) if q.audited else None
    return (
        n_tokens,
        False,
        coverage(union, q.evidence),
        coverage(verbatim, q.evidence),
        audited_u,
        audited_v,
    )


def ceiling(conv: Conversation, q: Question, mode: str) -> Coverage:
    """Best achievable coverage in a mode: all evidence in the queried subjects."""
    if mode == "S":
        return coverage(set(q.evidence), q.evidence)
    speaker_of = conv.speaker_of
    queried = {s for s, _ in query_plan(conv, q.question, mode, 2)}
    reachable = {e for e in q.evidence if person_subject(conv.sample_id, speaker_of[e]) in queried}
    return coverage(reachable, q.evidence)


# ---------------------------------------------------------------- aggregation

METRICS = ("strict", "frac", "any", "session")


def _metric_means(values: Sequence[Coverage]) -> dict[str, float]:
    return {m: mean([getattr(v, m) for v in values]) for m in METRICS}


def summarise(
    results: Sequence[QuestionResult], pick: Callable[[QuestionResult], Coverage | None]
) -> dict[str, Any]:
    """Micro, per-category, macro-over-categories and per-conversation means."""
    pairs = [(r, c) for r in results if (c := pick(r)) is not None]
    micro = _metric_means([c for _, c in pairs])
    by_cat: dict[str, Any] = {}
    for cat in sorted({r.category for r, _ in pairs}):
        chosen = [c for r, c in pairs if r.category == cat]
        by_cat[str(cat)] = {**_metric_means(chosen), "n": len(chosen)}
    macro = {m: mean([v[m] for v in by_cat.values()]) for m in METRICS}
    by_conv: dict[str, Any] = {}
    for sid in dict.fromkeys(r.sample_id for r, _ in pairs):
        chosen = [c for r, c in pairs if r.sample_id == sid]
        by_conv[sid] = {**_metric_means(chosen), "n": len(chosen)}
    return {
        **micro,
        "n": len(pairs),
        "by_category": by_cat,
        "macro": macro,
        "by_conversation": by_conv,
    }


def cell_summary(results: Sequence[QuestionResult], budget: int) -> dict[str, Any]:
    """``results[system][mode][budget]``: headline (a) or (b) plus the other columns."""
    union = summarise(results, lambda r: r.union)
    latencies = [r.latency_ms for r in results]
    tokens = [r.n_tokens for r in results]
    cell: dict[str, Any] = {
        **union,
        "mean_tokens": mean(tokens),
        "mean_tokens_over_B": mean(tokens) / budget if tokens else float("nan"),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "over_budget": sum(r.over_budget for r in results),
        "verbatim": summarise(results, lambda r: r.verbatim),
    }
    if any(r.audited_union is not None for r in results):
        cell["audited"] = {
            **summarise(results, lambda r: r.audited_union),
            "verbatim": summarise(results, lambda r: r.audited_verbatim),
        }
    return cell


# ---------------------------------------------------------------- the run


def evaluate_system(
    name: str,
    factory: SystemFactory,
    convs: Sequence[Conversation],
    mode: str,
    budgets: Sequence[int],
) -> list[QuestionResult]:
    """Ingest every conversation into a fresh system, then ask every question."""
    system: BenchSystem = factory()
    for conv in convs:
        for subject, turns in subjects_for_mode(conv, mode).items():
            system.ingest(subject, turns)
    _warm_up(system, convs, mode, budgets)
    out: list[QuestionResult] = []
    for conv in convs:
        for q in conv.questions:
            for budget in budgets:
                slices, elapsed = _ask(system, conv, q, mode, budget)
                n, over, union, verb, a_union, a_verb = score_question(conv, q, slices, budget)
                out.append(
                    QuestionResult(
                        conv.sample_id,
                        q.qa_index,
                        q.category,
                        budget,
                        mode,
                        name,
                        n,
                        over,
                        union,
                        verb,
                        a_union,
                        a_verb,
                        elapsed,
                    )
                )
    return out


def _ask(
    system: BenchSystem, conv: Conversation, q: Question, mode: str, budget: int
) -> tuple[list[BenchSlice], float]:
    """Run the query plan; latency is the summed wall time of the slice calls only."""
    slices: list[BenchSlice] = []
    elapsed = 0.0
    for subject, part_budget in query_plan(conv, q.question, mode, budget):
        if isinstance(system, GoldAware):
            system.set_gold(subject, q.question, q.evidence)
        start = time.perf_counter()
        slices.append(system.slice(subject, q.question, part_budget, conv.now))
        elapsed += (time.perf_counter() - start) * 1000.0
    return slices, elapsed


def _warm_up(
    system: BenchSystem, convs: Sequence[Conversation], mode: str, budgets: Sequence[int]
) -> None:
    """One untimed slice per subject, so lazy index builds are not timed as latency."""
    for conv in convs:
        for subject in subjects_for_mode(conv, mode):
            system.slice(subject, "warm up", min(budgets), conv.now)


def default_systems(
    names: Sequence[str], convs: Sequence[Conversation]
) -> dict[str, SystemFactory]:
    """Baselines with the SPEC's dialogue lines; the embedder is warmed with every
    rendered turn in one batch (ingestion work, not slice latency)."""

    def warm() -> list[str]:
        return [render_dialogue_line(t) for c in convs for t in c.turns]

    return baseline_factories(names, warm_texts=warm)


def run_locomo(
    data_path: Path | str = DEFAULT_DATA_DIR / "locomo_dev.json",
    out_path: Path | str | None = None,
    systems: Mapping[str, SystemFactory] | None = None,
    budgets: Sequence[int] = BUDGETS,
    modes: Sequence[str] = MODES,
    markdown_path: Path | str | None = None,
    rows_path: Path | str | None = None,
    audit_path: Path | str | None = "auto",
    categories: Sequence[int] = CATEGORIES,
    sample_ids: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run LoCoMo-ER@B for every system, mode and budget; return the results dict.

    ``systems`` maps a reported name to a factory (default: all baselines); add
    ``{"uprof": make_uprof}`` to measure the service beside them. ``audit_path``
    "auto" uses ``locomo-audit/errors.json`` beside the data if present; None turns
    the audited column off. Writes JSON to ``out_path``, rows to ``rows_path``
    (default ``<out>.rows.jsonl``) and a Markdown section to ``markdown_path``.
    """
    data_path = Path(data_path)
    if audit_path == "auto":
        audit_path = data_path.parent / "locomo-audit" / "errors.json"
    audit = Path(audit_path) if audit_path is not None else None
    convs = load_locomo(data_path, audit, categories, sample_ids)
    systems = systems if systems is not None else default_systems(BASELINE_NAMES, convs)
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")

    report: dict[str, Any] = {
        "benchmark": "LoCoMo-ER@B",
        "data": {
            "path": str(data_path),
            "conversations": [c.sample_id for c in convs],
            "n_turns": sum(len(c.turns) for c in convs),
            "n_questions": sum(len(c.questions) for c in convs),
            "questions_by_category": {
                str(cat): sum(q.category == cat for c in convs for q in c.questions)
                for cat in categories
            },
            "audit": str(audit) if audit is not None and audit.exists() else None,
        },
        "budgets": list(budgets),
        "modes": list(modes),
        "categories": list(categories),
        "max_derived_refs": MAX_DERIVED_REFS,
        "systems": list(systems),
        "run": {**run_context(), "torch_threads": {}},
        "results": {},
        "er_auc": {},
        "ceiling": {
            mode: _metric_means([ceiling(c, q, mode) for c in convs for q in c.questions])
            for mode in modes
        },
        "run_seconds": {},
    }
    all_rows: list[QuestionResult] = []
    for name, factory in systems.items():
        by_mode: dict[str, Any] = {}
        for mode in modes:
            start = time.perf_counter()
            rows = evaluate_system(name, factory, convs, mode, budgets)
            report["run_seconds"].setdefault(name, {})[mode] = time.perf_counter() - start
            all_rows.extend(rows)
            by_mode[mode] = {
                str(b): cell_summary([r for r in rows if r.budget == b], b) for b in budgets
            }
            if progress:
                progress(f"{name} {mode}: {report['run_seconds'][name][mode]:.1f}s")
        report["results"][name] = by_mode
        report["er_auc"] = er_auc(report["results"], budgets)
        report["run"]["torch_threads"][name] = torch_thread_count()
        report["run"]["load_avg_end"] = run_context()["load_avg"]
        # Written after every system: a long run shows its finished systems early,
        # and the table marks the ones still missing.
        _write_outputs(report, all_rows, out_path, rows_path, markdown_path)
    return report


def er_auc(results: Mapping[str, Any], budgets: Sequence[int]) -> dict[str, Any]:
    """Mean ER-strict over the budgets run, per system and mode, (a) or (b) and (a)."""
    out: dict[str, Any] = {}
    for name, by_mode in results.items():
        for mode, cells in by_mode.items():
            out.setdefault(name, {})[mode] = {
                "strict": mean([cells[str(b)]["strict"] for b in budgets]),
                "verbatim_strict": mean([cells[str(b)]["verbatim"]["strict"] for b in budgets]),
            }
    return out


def _write_outputs(
    report: dict[str, Any],
    rows: Sequence[QuestionResult],
    out_path: Path | str | None,
    rows_path: Path | str | None,
    markdown_path: Path | str | None,
) -> None:
    from benchmarks.report import locomo_markdown, write_markdown_section

    if out_path is not None:
        out = Path(out_path)
        if rows_path is None:
            rows_path = out.with_name(out.stem + ".rows.jsonl")
        report["rows_path"] = str(rows_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    if rows_path is not None:
        path = Path(rows_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r.row()) + "\n")
    if markdown_path is not None:
        write_markdown_section(Path(markdown_path), "locomo", locomo_markdown(report))


# ---------------------------------------------------------------- CLI


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the baselines (or a subset) and print the summary table."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.locomo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR / "locomo_dev.json")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    parser.add_argument(
        "--rows", type=Path, default=None, help="rows JSONL (default <out>.rows.jsonl)"
    )
    parser.add_argument("--markdown", type=Path, default=None, help="Markdown file to update")
    parser.add_argument("--systems", type=_str_list, default=list(BASELINE_NAMES))
    parser.add_argument("--budgets", type=_int_list, default=list(BUDGETS))
    parser.add_argument("--modes", type=_str_list, default=list(MODES))
    parser.add_argument("--audit", default="auto", help='errors.json path, "auto" or "none"')
    parser.add_argument("--conversations", type=_str_list, default=None, help="sample ids subset")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="torch intra-op threads (0: leave as is)"
    )
    args = parser.parse_args(argv)
    set_torch_threads(args.torch_threads or None)

    from benchmarks.report import locomo_markdown

    audit = None if args.audit == "none" else args.audit
    convs = load_locomo(args.data, None, CATEGORIES, args.conversations)
    report = run_locomo(
        data_path=args.data,
        out_path=args.out,
        systems=default_systems(args.systems, convs),
        budgets=args.budgets,
        modes=args.modes,
        markdown_path=args.markdown,
        rows_path=args.rows,
        audit_path=audit,
        sample_ids=args.conversations,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(locomo_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
