"""Profile fidelity (SPEC §3) and the seeds' table 2 (UProf paper, §4.2).

``uprof bench fidelity`` runs, on one throwaway deployment per part, every
capture, read and deletion through the authorized facade (``uprof.facade``): the
benchmark app ``app:bench`` captures and reads; the local operator inspects the
profile, resolves evidence and erases, as a DPO console would. Nothing is
written to storage directly, and LoCoMo's ``observation``, summaries and ``qa``
are never ingested (they are the labels).

Parts:

* ``provenance``: LoCoMo in mode P (one subject per person). For each silver
  fact of ``observation`` with its source turn: does the speaker's profile hold
  an item whose evidence cites that turn? And: items in A's profile citing a
  turn that B spoke (must be 0).
* ``personas``: ``msc_personas_all.json``, two subjects per pair, each persona
  sentence captured as one event. Exact preservation, cross-subject leakage
  (profile items and slices), duplicate attributes within a subject (must be
  merged) and attributes merged across subjects (must be 0).
* ``fabrication`` is measured in every part: the share of attributes (and,
  reported beside them, intents) that are not marked inferred and have no
  evidence pointer that resolves to a captured event of the same subject.
* ``table2``: LoCoMo mode S, uprof beside naive retrieval over raw turns (BM25,
  MiniLM): fabrication rate, deletion residue by question, injected tokens
  against full context at equal evidence recall, end-to-end slice latency.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.baselines import baseline_factories
from benchmarks.bench_common import (
    BenchSlice,
    BenchTurn,
    SliceItemRef,
    count_tokens,
    mean,
    normalise_text,
    percentile,
    render_dialogue_line,
)
from benchmarks.locomo import (
    Conversation,
    load_locomo,
    normalise_evidence,
    person_subject,
    score_question,
    session_numbers,
    subjects_for_mode,
)
from benchmarks.report import table, write_markdown_section
from benchmarks.uprof_system import AGENT, APP, PURPOSE, bench_authorizer, bench_interaction
from domain.errors import ItemNotFoundError
from domain.principal import Principal, PrincipalKind
from policies.rules import PolicyRule
from uprof.bootstrap import bootstrap
from uprof.facade import Facade
from uprof.kernel import Uprof
from uprof.settings import Settings

Progress = Callable[[str], None]
CAPTURE_BATCH = 1_000
#: An item citing more source turns than this is a summary, not a fact (SPEC §1 rule b).
MAX_DERIVED_REFS = 3
PERSONA_EPOCH = datetime(2024, 1, 1, 9, tzinfo=UTC)
TABLE2_BUDGETS = (256, 512, 1024, 2048, 4096)
RECALL_TARGETS = (0.5, 0.6, 0.65)
SPEAKERS = ("Speaker 1", "Speaker 2")
LATENCY_BUDGET = 1024


def _quiet(_: str) -> None:
    return None


# ------------------------------------------------------------------ deployment


def fidelity_authorizer() -> Any:
    """The benchmark policy (read and capture everything) plus consent for app:bench.

    The operator records each subject's consent on behalf of the app, which the
    app's own policy must allow (``consent`` action), as for any onboarded app.
    """
    authorizer = bench_authorizer()
    authorizer.add_rule(PolicyRule(APP, "default", "consent", "any", PURPOSE))
    return authorizer


class FacadeDeployment:
    """A throwaway deployment reached only through the facade.

    ``app`` is app:bench's door (capture, slice); ``operator`` is the local
    operator's door (profile, evidence, erasure, pipeline runs).
    """

    def __init__(self, settings: Settings | None = None, **bootstrap_kw: Any) -> None:
        self._dir: Path | None = None
        if settings is None:
            self._dir = Path(tempfile.mkdtemp(prefix="uprof-fidelity-"))
            settings = Settings(data_dir=self._dir / "data", embedder="minilm")
        self.kernel: Uprof = bootstrap(settings, authorizer=fidelity_authorizer(), **bootstrap_kw)
        tenant = self.kernel.subjects.tenant
        self.operator = Facade(self.kernel, Principal.local_operator(tenant))
        self.app = Facade(self.kernel, Principal(tenant, APP, "bench", PrincipalKind.APP))
        #: subject -> source_ref -> capture id (from the capture acks)
        self.captures: dict[str, dict[str, str]] = {}

    def ingest(self, subject: str, turns: Sequence[BenchTurn], *, process: bool = True) -> None:
        if subject not in self.captures:
            self.operator.grant_consent(subject, app_id=APP, categories=["*"], purposes=[PURPOSE])
        refs = self.captures.setdefault(subject, {})
        interactions = [bench_interaction(t) for t in turns]
        for lo in range(0, len(interactions), CAPTURE_BATCH):
            chunk = interactions[lo : lo + CAPTURE_BATCH]
            acks = self.app.capture_many(subject, chunk)
            for interaction, ack in zip(chunk, acks, strict=True):
                refs[interaction.source_ref] = ack.capture_id
        if process:
            self.operator.process()

    def slice(self, subject: str, query: str, budget: int, now: datetime) -> Any:
        return self.app.slice(
            subject, query, budget_tokens=budget, purpose=PURPOSE, agent_id=AGENT, now=now
        )

    def close(self) -> None:
        self.kernel.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


# ------------------------------------------------------------------ held items


@dataclass(frozen=True)
class HeldItem:
    """One item of a profile with its evidence pointers, resolved through the facade.

    ``resolved`` maps each pointer that names a captured event of the same subject
    to that event's (source_ref, actor); pointers missing from it are dangling.
    """

    subject: str
    layer: str  # attribute | intent | memory
    item_id: str
    text: str
    provenance: str
    evidence: tuple[str, ...]
    resolved: Mapping[str, tuple[str, str]]
    source_refs: tuple[str, ...] = ()

    @property
    def cited_refs(self) -> set[str]:
        return {ref for ref, _ in self.resolved.values()} | set(self.source_refs)


def held_items(dep: FacadeDeployment, subject: str) -> list[HeldItem]:
    """Every item of the subject's profile, each pointer resolved against the captures."""
    view = dep.operator.profile(subject)
    pointers = {
        e
        for layer in (view.attributes, view.intents, view.memories)
        for i in layer
        for e in i.evidence
    }
    rows = dep.operator.evidence_captures(subject, pointers) if pointers else {}
    resolved = {cid: (row.source_ref, row.actor) for cid, row in rows.items()}

    def item(layer: str, row: Any, text: str, refs: tuple[str, ...] = ()) -> HeldItem:
        return HeldItem(
            subject,
            layer,
            row.item_id,
            text,
            str(row.provenance),
            tuple(row.evidence),
            {e: resolved[e] for e in row.evidence if e in resolved},
            refs,
        )

    return (
        [item("attribute", a, f"{a.key}: {a.value}") for a in view.attributes]
        + [item("intent", i, i.description) for i in view.intents]
        + [item("memory", m, m.text, tuple(m.source_refs)) for m in view.memories]
    )


@dataclass
class Fabrication:
    """Attributes (and intents) with no resolvable evidence that are not marked inferred."""

    attributes: int = 0
    fabricated_attributes: int = 0
    intents: int = 0
    fabricated_intents: int = 0
    inferred: int = 0
    dangling_pointers: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.fabricated_attributes / self.attributes if self.attributes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate}


def measure_fabrication(items: Iterable[HeldItem], into: Fabrication | None = None) -> Fabrication:
    """SPEC §3: a fabricated attribute has no resolvable pointer and is not inferred."""
    out = into if into is not None else Fabrication()
    for item in items:
        if item.layer not in ("attribute", "intent"):
            continue
        out.dangling_pointers += len(item.evidence) - len(item.resolved)
        inferred = item.provenance == "inferred"
        out.inferred += inferred
        fabricated = not inferred and not item.resolved
        if item.layer == "attribute":
            out.attributes += 1
            out.fabricated_attributes += fabricated
        else:
            out.intents += 1
            out.fabricated_intents += fabricated
        if fabricated and len(out.examples) < 5:
            out.examples.append(f"{item.subject}:{item.item_id}")
    return out


# ------------------------------------------------------------------ provenance


@dataclass(frozen=True)
class SilverFact:
    sample_id: str
    speaker: str
    refs: tuple[str, ...]


def silver_facts(raw: Mapping[str, Any], known: Iterable[str]) -> list[SilverFact]:
    """(speaker, source turns) of every generated observation; the text is not kept."""
    known = set(known)
    out: list[SilverFact] = []
    observations = raw.get("observation") or {}
    for n in session_numbers(raw["conversation"]):
        per_speaker = observations.get(f"session_{n}_observation") or {}
        for speaker, facts in per_speaker.items():
            for fact in facts:
                evidence = fact[1] if len(fact) > 1 else []
                pieces = evidence if isinstance(evidence, list) else [evidence]
                refs = normalise_evidence(pieces, known)
                if refs:
                    out.append(SilverFact(raw["sample_id"], speaker, refs))
    return out


def run_provenance(
    dep: FacadeDeployment, data: Path, sample_ids: Sequence[str] | None, echo: Progress
) -> dict[str, Any]:
    raw_all = json.loads(data.read_text(encoding="utf-8"))
    convs = {c.sample_id: c for c in load_locomo(data, audit_path=None, sample_ids=sample_ids)}
    facts: list[SilverFact] = []
    for raw in raw_all:
        conv = convs.get(raw["sample_id"])
        if conv is None:
            continue
        facts += silver_facts(raw, (t.source_ref for t in conv.turns))
        for subject, turns in subjects_for_mode(conv, "P-both").items():
            dep.ingest(subject, turns, process=False)
        echo(f"provenance: captured {conv.sample_id}")
    dep.operator.process()
    fabrication = Fabrication()
    cited_any: dict[str, set[str]] = {}
    cited_fact: dict[str, set[str]] = {}  # attribute or intent
    items_total = cross_items = foreign_pointers = 0
    for conv in convs.values():
        speaker_of = conv.speaker_of
        for speaker in conv.speakers:
            subject = person_subject(conv.sample_id, speaker)
            items = held_items(dep, subject)
            measure_fabrication(items, fabrication)
            other = person_subject(conv.sample_id, next(s for s in conv.speakers if s != speaker))
            for item in items:
                items_total += 1
                refs = item.cited_refs
                spoken_by_other = any(speaker_of.get(r, speaker) != speaker for r in refs)
                wrong_actor = any(actor != speaker for _, actor in item.resolved.values())
                dangling = set(item.evidence) - set(item.resolved)
                in_other = dep.operator.evidence_captures(other, dangling) if dangling else {}
                foreign_pointers += len(in_other)
                cross_items += bool(spoken_by_other or wrong_actor or in_other)
                cited_any.setdefault(subject, set()).update(refs)
                if item.layer != "memory":
                    cited_fact.setdefault(subject, set()).update(refs)
    reachable = hits_any = hits_fact = 0
    for f in facts:
        conv = convs[f.sample_id]
        subject = person_subject(f.sample_id, f.speaker)
        own = [r for r in f.refs if conv.speaker_of.get(r) == f.speaker]
        reachable += bool(own)
        hits_any += bool(set(f.refs) & cited_any.get(subject, set()))
        hits_fact += bool(set(f.refs) & cited_fact.get(subject, set()))
    n = len(facts)
    return {
        "conversations": len(convs),
        "subjects": 2 * len(convs),
        "silver_facts": n,
        "ceiling": reachable / n if n else math.nan,
        "recall_any_item": hits_any / n if n else math.nan,
        "recall_attribute_or_intent": hits_fact / n if n else math.nan,
        "items": items_total,
        "items_citing_other_speaker": cross_items,
        "pointers_into_other_subject": foreign_pointers,
        "fabrication": fabrication.as_dict(),
    }


# ------------------------------------------------------------------ personas


def persona_turns(pair: int, speaker: str, sentences: Sequence[str]) -> list[BenchTurn]:
    at = PERSONA_EPOCH + timedelta(minutes=pair)
    tag = speaker.replace(" ", "")
    return [
        BenchTurn(f"P{pair}:{tag}:{i}", speaker, s, at + timedelta(seconds=i), 1)
        for i, s in enumerate(sentences)
    ]


def _norm_value(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _padded(text: str) -> str:
    return f" {_norm_value(text)} "


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9']+", text.lower()))


def near_duplicate(a: str, b: str, threshold: float = 0.8) -> bool:
    """Word-set Jaccard at or above threshold ("I like Metallica." ~ "i like metallica")."""
    wa, wb = _words(a), _words(b)
    return bool(wa and wb) and len(wa & wb) / len(wa | wb) >= threshold


def near_duplicate_pairs(sentences: Sequence[str]) -> list[tuple[int, int]]:
    return [
        (i, j)
        for i in range(len(sentences))
        for j in range(i + 1, len(sentences))
        if near_duplicate(sentences[i], sentences[j])
    ]


def run_personas(
    dep: FacadeDeployment,
    data: Path,
    split: str,
    pairs: int | None,
    echo: Progress,
) -> dict[str, Any]:
    records = json.loads(data.read_text(encoding="utf-8"))[split]
    if pairs is not None:
        records = records[:pairs]
    plan: list[tuple[int, dict[str, list[str]]]] = []
    for p, rec in enumerate(records):
        people = {sp: [s for s in rec.get(sp, []) if s.strip()] for sp in SPEAKERS}
        if all(people.values()):
            plan.append((p, people))
    for p, people in plan:
        for speaker, sentences in people.items():
            turns = persona_turns(p, speaker, sentences)
            dep.ingest(f"{split}-{p}/{speaker}", turns, process=False)
        if p % 200 == 0:
            echo(f"personas: captured pair {p}/{len(records)}")
    dep.operator.process()
    fabrication = Fabrication()
    sentences_total = exact_capture = exact_memory = 0
    leaked_items = leaked_slices = slice_probes = 0
    dup_groups = cross_merged = 0
    merged_dupes = near_pairs = near_merged = cross_near = 0
    now = PERSONA_EPOCH + timedelta(days=30)
    for p, people in plan:
        subjects = {sp: f"{split}-{p}/{sp}" for sp in people}
        for speaker, sentences in people.items():
            subject = subjects[speaker]
            other_sp = next(s for s in people if s != speaker)
            # The other person's sentences this one never said (as word sequences,
            # padded so a match is whole words): finding one here is a leak.
            own = [_padded(s) for s in sentences]
            other_only = {
                o: _padded(o)
                for o in people[other_sp]
                if len(_padded(o).split()) >= 3 and not any(_padded(o) in w for w in own)
            }
            items = held_items(dep, subject)
            measure_fabrication(items, fabrication)
            refs = dep.captures[subject]
            rows = dep.operator.evidence_captures(subject, set(refs.values()))
            memory_texts = [normalise_text(i.text) for i in items if i.layer == "memory"]
            for i, sentence in enumerate(sentences):
                sentences_total += 1
                row = rows.get(refs[f"P{p}:{speaker.replace(' ', '')}:{i}"])
                exact_capture += row is not None and row.user_input == sentence
                needle = normalise_text(sentence)
                exact_memory += any(needle in m for m in memory_texts)
            other_refs = set(dep.captures[subjects[other_sp]].values())
            for item in items:
                text = _padded(item.text)
                leaked = bool(set(item.evidence) & other_refs) or any(
                    actor != speaker for _, actor in item.resolved.values()
                )
                if item.layer == "memory":
                    leaked = leaked or any(o in text for o in other_only.values())
                leaked_items += leaked
            # A slice of this subject asked with the other person's sentence.
            probe = next(iter(sorted(other_only)), None)
            if probe is not None:
                slice_probes += 1
                sl = dep.slice(subject, probe, 256, now)
                text = _padded(sl.text)
                cited = {e for it in sl.items for e in it.evidence}
                leaked_slices += bool(cited & other_refs) or any(
                    o in text for o in other_only.values()
                )
            # Duplicates: one active attribute per (key, value) within a subject.
            groups: dict[tuple[str, str], int] = {}
            for item in items:
                if item.layer == "attribute":
                    key = (item.text.split(":", 1)[0], _norm_value(item.text.split(":", 1)[1]))
                    groups[key] = groups.get(key, 0) + 1
                    cross_merged += bool(set(item.evidence) & other_refs)
                    if len(item.resolved) > 1:
                        merged_dupes += 1
            dup_groups += sum(1 for n in groups.values() if n > 1)
            # Near-duplicate sentences of this subject that both gave attributes:
            # merged when one attribute cites both captures.
            tag = speaker.replace(" ", "")
            cites: dict[str, set[str]] = {}
            for item in items:
                if item.layer == "attribute":
                    for e in item.evidence:
                        cites.setdefault(e, set()).add(item.item_id)
            for i, j in near_duplicate_pairs(sentences):
                a, b = refs[f"P{p}:{tag}:{i}"], refs[f"P{p}:{tag}:{j}"]
                if cites.get(a) and cites.get(b):
                    near_pairs += 1
                    near_merged += bool(cites[a] & cites[b])
        cross_near += sum(
            1 for x in people["Speaker 1"] for y in people["Speaker 2"] if near_duplicate(x, y)
        )
    n = sentences_total
    return {
        "split": split,
        "pairs": len(plan),
        "subjects": 2 * len(plan),
        "sentences": n,
        "exact_capture": exact_capture / n if n else math.nan,
        "exact_in_memory": exact_memory / n if n else math.nan,
        "items_leaked_from_other_subject": leaked_items,
        "slice_probes": slice_probes,
        "slices_with_other_subject_text": leaked_slices,
        "duplicate_attribute_groups_within_subject": dup_groups,
        "attributes_merged_from_several_captures": merged_dupes,
        "near_duplicate_pairs_within_subject_with_attributes": near_pairs,
        "near_duplicate_pairs_merged": near_merged,
        "near_duplicate_sentences_across_pair": cross_near,
        "attributes_citing_other_subject": cross_merged,
        "fabrication": fabrication.as_dict(),
    }


# ------------------------------------------------------------------ table 2


class UprofTable2:
    """uprof in the table: a facade deployment plus the deletion verbs it offers."""

    name = "uprof"

    def __init__(self, dep: FacadeDeployment) -> None:
        self.dep = dep

    def ingest(self, subject: str, turns: Sequence[BenchTurn]) -> None:
        self.dep.ingest(subject, turns, process=False)

    def slice(self, subject: str, query: str, budget: int, now: datetime) -> BenchSlice:
        sl = self.dep.slice(subject, query, budget, now)
        return BenchSlice(sl.text, tuple(SliceItemRef(i.source_refs) for i in sl.items))

    def delete(self, subject: str, refs: Sequence[str], variant: str) -> None:
        """Delete what the turns said: their captures, or every item citing them."""
        ids = [self.dep.captures[subject][r] for r in refs]
        if variant == "capture":
            for cid in ids:
                self.dep.operator.erase_capture(subject, cid)
            return
        wanted = set(ids)
        for item in held_items(self.dep, subject):
            if set(item.evidence) & wanted:
                try:
                    self.dep.operator.erase_item(subject, item.item_id, with_evidence=True)
                except ItemNotFoundError:  # an earlier erasure of the same capture took it
                    pass

    def residue_items(self, subject: str, refs: Sequence[str], texts: Sequence[str]) -> int:
        """Derived items still citing the deleted turns or holding their text."""
        ids = {self.dep.captures[subject][r] for r in refs}
        left = 0
        for item in held_items(self.dep, subject):
            text = normalise_text(item.text)
            left += bool(
                set(item.evidence) & ids
                or item.cited_refs & set(refs)
                or any(t in text for t in texts)
            )
        left += len(self.dep.operator.evidence_captures(subject, ids))
        return left


class NaiveTable2:
    """A line baseline over raw turns; deleting a turn drops it and rebuilds the index."""

    def __init__(self, name: str, system: Any) -> None:
        self.name = name
        self._system = system
        self._turns: dict[str, list[BenchTurn]] = {}

    def ingest(self, subject: str, turns: Sequence[BenchTurn]) -> None:
        self._turns.setdefault(subject, []).extend(turns)
        self._system.ingest(subject, turns)

    def slice(self, subject: str, query: str, budget: int, now: datetime) -> BenchSlice:
        packed: BenchSlice = self._system.slice(subject, query, budget, now)
        return packed

    def delete(self, subject: str, refs: Sequence[str], variant: str) -> None:
        gone = set(refs)
        self._turns[subject] = [t for t in self._turns[subject] if t.source_ref not in gone]
        self._system.forget(subject)
        self._system.ingest(subject, self._turns[subject])

    def residue_items(self, subject: str, refs: Sequence[str], texts: Sequence[str]) -> int:
        return sum(t.source_ref in set(refs) for t in self._turns[subject])


def full_context_tokens(conv: Conversation) -> int:
    """The whole conversation rendered as the baselines render turns."""
    return count_tokens("\n".join(render_dialogue_line(t) for t in conv.turns))


def tokens_at_recall(curve: Sequence[tuple[float, float]], target: float) -> tuple[float, bool]:
    """Mean injected tokens where the recall curve first reaches target (interpolated).

    ``curve`` holds (mean tokens, recall) per budget, ascending budgets. Returns
    (tokens, bound): ``bound`` is True when the smallest budget already reaches the
    target, so the figure is an upper bound. NaN when the sweep never reaches it.
    """
    prev: tuple[float, float] | None = None
    for tokens, recall in curve:
        if recall >= target:
            if prev is None:
                return tokens, True
            share = (target - prev[1]) / (recall - prev[1])
            return prev[0] + share * (tokens - prev[0]), False
        prev = (tokens, recall)
    return math.nan, False


def deletion_questions(conv: Conversation, per_conversation: int) -> list[Any]:
    """Questions whose evidence turns have text found nowhere else in the conversation.

    Evidence sets are disjoint, so one question's deletion never answers for another's;
    turns of fewer than 20 characters are avoided (their text recurs by chance).
    """
    counts: dict[str, int] = {}
    for text in conv.verbatim.values():
        counts[text] = counts.get(text, 0) + 1
    chosen: list[Any] = []
    used: set[str] = set()
    for q in conv.questions:
        texts = [conv.verbatim[e] for e in q.evidence]
        if set(q.evidence) & used or any(counts[t] > 1 or len(t) < 20 for t in texts):
            continue
        chosen.append(q)
        used |= set(q.evidence)
        if len(chosen) >= per_conversation:
            break
    return chosen


def run_table2(
    data: Path,
    systems: Sequence[str],
    budgets: Sequence[int],
    sample_ids: Sequence[str] | None,
    deletions: int,
    echo: Progress,
    deployment: Callable[[], FacadeDeployment] = FacadeDeployment,
    embed: Any = None,
) -> dict[str, Any]:
    convs = load_locomo(data, audit_path=None, sample_ids=sample_ids)
    full = {c.sample_id: full_context_tokens(c) for c in convs}
    questions = [(c, q) for c in convs for q in c.questions]
    full_mean = mean([full[c.sample_id] for c, _ in questions])
    out: dict[str, Any] = {
        "conversations": len(convs),
        "questions": len(questions),
        "budgets": list(budgets),
        "full_context_mean_tokens": full_mean,
        "systems": {},
    }
    naive = baseline_factories([s for s in systems if s != "uprof"], embed=embed)
    for name in systems:
        dep = deployment() if name == "uprof" else None
        system: Any = UprofTable2(dep) if dep else NaiveTable2(name, naive[name]())
        try:
            began = time.perf_counter()
            for conv in convs:
                system.ingest(conv.sample_id, list(conv.turns))
            if dep is not None:
                dep.operator.process()
            ingest_s = time.perf_counter() - began
            echo(f"table2: {name} ingested in {ingest_s:.0f} s")
            row = _sweep(system, convs, budgets)
            row["ingest_s"] = ingest_s
            if dep is not None:
                fab = Fabrication()
                for conv in convs:
                    measure_fabrication(held_items(dep, conv.sample_id), fab)
                row["fabrication"] = fab.as_dict()
            else:
                # Every line served is a stored raw turn: nothing derived to fabricate.
                row["fabrication"] = Fabrication().as_dict()
            row["slice_items_unresolved"] = row.pop("_unresolved")
            row["deletion"] = _deletion(system, convs, deletions, budgets)
            out["systems"][name] = row
            echo(f"table2: {name} done")
        finally:
            if dep is not None:
                dep.close()
    for row in out["systems"].values():
        row["tokens_at_recall"] = recall_costs(row, budgets, full_mean)
    return out


def recall_costs(
    row: Mapping[str, Any], budgets: Sequence[int], full_mean: float
) -> dict[str, dict[str, Any]]:
    """Tokens at which one method's ER-strict reaches each target, and the share of full."""
    curve = [
        (row["by_budget"][str(b)]["mean_tokens"], row["by_budget"][str(b)]["strict"])
        for b in budgets
    ]
    out: dict[str, dict[str, Any]] = {}
    for target in RECALL_TARGETS:
        tokens, bound = tokens_at_recall(curve, target)
        out[str(target)] = {"tokens": tokens, "at_most": bound, "of_full": tokens / full_mean}
    return out


def _sweep(system: Any, convs: Sequence[Conversation], budgets: Sequence[int]) -> dict[str, Any]:
    for conv in convs:  # untimed: lazy index builds are ingestion work
        system.slice(conv.sample_id, "warm up", min(budgets), conv.now)
    by_budget: dict[str, Any] = {}
    unresolved = 0
    # The latency budget goes first: each question's first slice is its cold one
    # for every system (baselines and uprof alike cache per-query work).
    order = sorted(budgets, key=lambda b: (b != LATENCY_BUDGET, b))
    for budget in order:
        tokens: list[float] = []
        strict: list[float] = []
        latency: list[float] = []
        for conv in convs:
            known = {t.source_ref for t in conv.turns}
            for q in conv.questions:
                began = time.perf_counter()
                sl = system.slice(conv.sample_id, q.question, budget, conv.now)
                latency.append((time.perf_counter() - began) * 1000.0)
                n, _, union, *_ = score_question(conv, q, [sl], budget)
                tokens.append(n)
                strict.append(union.strict)
                unresolved += sum(
                    1 for it in sl.items if it.source_refs and not set(it.source_refs) <= known
                )
        by_budget[str(budget)] = {
            "mean_tokens": mean(tokens),
            "strict": mean(strict),
            "p50_ms": percentile(latency, 50),
            "p95_ms": percentile(latency, 95),
        }
    return {"by_budget": {str(b): by_budget[str(b)] for b in budgets}, "_unresolved": unresolved}


def _deletion(
    system: Any, convs: Sequence[Conversation], per_conv: int, budgets: Sequence[int]
) -> dict[str, Any]:
    """Delete each chosen question's evidence, then ask it again at the largest budget."""
    budget = max(budgets)
    asked = in_slice = in_items = either = present_before = 0
    variants: dict[str, int] = {"capture": 0, "item": 0}
    for conv in convs:
        for k, q in enumerate(deletion_questions(conv, per_conv)):
            variant = "capture" if k % 2 == 0 else "item"
            texts = [conv.verbatim[e] for e in q.evidence]
            before = system.slice(conv.sample_id, q.question, budget, conv.now)
            _, _, covered, *_ = score_question(conv, q, [before], budget)
            present_before += covered.any > 0
            system.delete(conv.sample_id, list(q.evidence), variant)
            variants[variant] += 1
            sl = system.slice(conv.sample_id, q.question, budget, conv.now)
            text = normalise_text(sl.text)
            cited = {r for it in sl.items for r in it.source_refs}
            asked += 1
            sliced = bool(cited & set(q.evidence) or any(t in text for t in texts))
            derived = bool(system.residue_items(conv.sample_id, list(q.evidence), texts))
            in_slice += sliced
            in_items += derived
            either += sliced or derived
    return {
        "questions": asked,
        "evidence_in_slice_before": present_before,
        "by_variant": variants,
        "budget": budget,
        "slices_with_residue": in_slice,
        "questions_with_derived_residue": in_items,
        "questions_with_residue": either,
        "residue_rate": either / asked if asked else 0.0,
    }


# ------------------------------------------------------------------ reporting


def _f(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def _fab(fab: Mapping[str, Any]) -> str:
    return f"{fab['fabricated_attributes']} / {fab['attributes']}"


def _tokens_cell(cell: Mapping[str, Any]) -> str:
    bound = "≤ " if cell["at_most"] else ""
    return f"{bound}{_f(cell['tokens'], 0)} ({bound}{_f(cell['of_full'])})"


def markdown(report: Mapping[str, Any]) -> str:
    parts = ["## Profile fidelity (SPEC §3) and the seeds' table 2", ""]
    for part, run in report.get("runs", {}).items():
        parts.append(
            f"- {part}: `{run['command']}` (load average at start {run['load_at_start']}; "
            f"{run.get('elapsed_s', '?')} s for the whole command)"
        )
    prov = report.get("provenance")
    if prov:
        parts += ["", "### Attribute provenance (LoCoMo `observation`, silver labels, mode P)", ""]
        parts.append(
            table(
                [
                    "silver facts",
                    "ceiling",
                    "recall (any item)",
                    "recall (attribute or intent)",
                    "items",
                    "items citing the other speaker",
                    "fabricated attributes",
                ],
                [
                    [
                        prov["silver_facts"],
                        _f(prov["ceiling"]),
                        _f(prov["recall_any_item"]),
                        _f(prov["recall_attribute_or_intent"]),
                        prov["items"],
                        prov["items_citing_other_speaker"],
                        _fab(prov["fabrication"]),
                    ]
                ],
            )
        )
    for per in report.get("personas", []):
        title = f"### Persona isolation (`msc_personas_all.json`, `{per['split']}` split)"
        parts += ["", title, ""]
        parts.append(
            table(
                [
                    "pairs",
                    "sentences",
                    "exact capture",
                    "exact in a memory",
                    "items leaked",
                    "slices leaked",
                    "near-duplicates merged within",
                    "duplicate attribute groups",
                    "near-duplicates across the pair",
                    "attributes merged across subjects",
                    "fabricated attributes",
                ],
                [
                    [
                        per["pairs"],
                        per["sentences"],
                        _f(per["exact_capture"]),
                        _f(per["exact_in_memory"]),
                        per["items_leaked_from_other_subject"],
                        f"{per['slices_with_other_subject_text']} / {per['slice_probes']}",
                        f"{per['near_duplicate_pairs_merged']} / "
                        f"{per['near_duplicate_pairs_within_subject_with_attributes']}",
                        per["duplicate_attribute_groups_within_subject"],
                        per["near_duplicate_sentences_across_pair"],
                        per["attributes_citing_other_subject"],
                        _fab(per["fabrication"]),
                    ]
                ],
            )
        )
    t2 = report.get("table2")
    if t2:
        parts += ["", "### Table 2: fidelity and deletion compliance (LoCoMo, mode S)", ""]
        targets = [str(t) for t in RECALL_TARGETS]
        header = [
            "method",
            "fabrication rate",
            "deletion residue",
            *[f"tokens at ER-strict {t} (of full)" for t in targets],
            f"slice p50 / p95 ms (B={LATENCY_BUDGET})",
        ]
        rows = []
        for name, row in t2["systems"].items():
            fab = row["fabrication"]
            dele = row["deletion"]
            lat = row["by_budget"].get(str(LATENCY_BUDGET), {})
            costs = recall_costs(row, t2["budgets"], t2["full_context_mean_tokens"])
            fab_cell = (
                f"{_f(fab['rate'])} ({fab['fabricated_attributes']} / {fab['attributes']})"
                if name == "uprof"
                else "0 (no derived items)"
            )
            rows.append(
                [
                    "naive RAG, " + name if name != "uprof" else "uprof",
                    fab_cell,
                    f"{_f(dele['residue_rate'])} ({dele['questions_with_residue']}"
                    f" / {dele['questions']})",
                    *[_tokens_cell(costs[t]) for t in targets],
                    f"{_f(lat.get('p50_ms', math.nan), 1)} / {_f(lat.get('p95_ms', math.nan), 1)}",
                ]
            )
        rows.append(
            [
                "full context",
                "0 (raw turns)",
                "—",
                *[f"{_f(t2['full_context_mean_tokens'], 0)} (1.000)" for _ in targets],
                "—",
            ]
        )
        parts.append(table(header, rows))
        parts += ["", "ER-strict and mean injected tokens per budget:", ""]
        budgets = t2["budgets"]
        parts.append(
            table(
                ["method", *[f"B={b}" for b in budgets]],
                [
                    [
                        n,
                        *[
                            f"{_f(r['by_budget'][str(b)]['strict'])} @ "
                            f"{_f(r['by_budget'][str(b)]['mean_tokens'], 0)}"
                            for b in budgets
                        ],
                    ]
                    for n, r in t2["systems"].items()
                ],
            )
        )
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------ entry point


def gate_failures(report: Mapping[str, Any]) -> list[str]:
    """The SPEC §3 promises that must hold exactly (0), broken in this report."""
    failed: list[str] = []

    def fab(where: str, fabrication: Mapping[str, Any]) -> None:
        if fabrication["fabricated_attributes"]:
            failed.append(f"{where}: {fabrication['fabricated_attributes']} fabricated attributes")

    prov = report.get("provenance")
    if prov:
        fab("provenance", prov["fabrication"])
        if prov["items_citing_other_speaker"]:
            failed.append(f"provenance: {prov['items_citing_other_speaker']} items cite B's turns")
    for per in report.get("personas", []):
        where = f"personas {per['split']}"
        fab(where, per["fabrication"])
        for key in (
            "items_leaked_from_other_subject",
            "slices_with_other_subject_text",
            "attributes_citing_other_subject",
            "duplicate_attribute_groups_within_subject",
        ):
            if per[key]:
                failed.append(f"{where}: {key} = {per[key]}")
    for name, row in (report.get("table2") or {}).get("systems", {}).items():
        fab(f"table2 {name}", row["fabrication"])
        if row["deletion"]["questions_with_residue"]:
            failed.append(f"table2 {name}: residue after deletion")
    return failed


def main(
    *,
    locomo: Path,
    personas: Path,
    parts: Sequence[str],
    splits: Sequence[str],
    pairs: int | None,
    conversations: Sequence[str] | None,
    systems: Sequence[str],
    budgets: Sequence[int],
    deletions: int,
    out: Path,
    markdown_path: Path | None,
    command: str,
    echo: Progress = _quiet,
) -> dict[str, Any]:
    import os

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    began = time.perf_counter()
    results: dict[str, Any] = {}
    if "provenance" in parts:
        dep = FacadeDeployment()
        try:
            results["provenance"] = run_provenance(dep, locomo, conversations, echo)
        finally:
            dep.close()
        echo(f"provenance: {json.dumps(results['provenance'])}")
    if "personas" in parts:
        results["personas"] = []
        for split in splits:
            dep = FacadeDeployment()
            try:
                results["personas"].append(run_personas(dep, personas, split, pairs, echo))
            finally:
                dep.close()
            echo(f"personas: {json.dumps(results['personas'][-1])}")
    if "table2" in parts:
        results["table2"] = run_table2(locomo, systems, budgets, conversations, deletions, echo)
    elapsed = round(time.perf_counter() - began)
    # Parts run separately (or in two processes) accumulate in one report, read
    # again just before writing; each part keeps the command and load it ran under.
    report: dict[str, Any] = {}
    if out.exists():
        report = json.loads(out.read_text(encoding="utf-8"))
    if "personas" in results:  # one entry per split: a train run keeps the test one
        fresh = {p["split"] for p in results["personas"]}
        kept = [p for p in report.get("personas", []) if p["split"] not in fresh]
        results["personas"] = sorted(kept + results["personas"], key=lambda p: p["split"])
    report.update(results)
    runs = report.setdefault("runs", {})
    labels = [p for p in results if p != "personas"]
    labels += [f"personas {split}" for split in splits] if "personas" in results else []
    for label in labels:
        runs[label] = {"command": command, "load_at_start": load, "elapsed_s": elapsed}
    runs.pop("personas", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    if markdown_path is not None:
        write_markdown_section(markdown_path, "fidelity", markdown(report))
    return report


__all__ = [
    "Fabrication",
    "FacadeDeployment",
    "HeldItem",
    "held_items",
    "main",
    "measure_fabrication",
]
