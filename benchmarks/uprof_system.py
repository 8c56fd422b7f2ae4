"""uprof as a system under test for the LoCoMo and PrefEval harnesses.

Ingestion goes through the public capture API, exactly as production traffic
does: a consent is granted for the benchmark app, every turn is captured (consent
gate, per-capture keys, sealed events), extraction and projections run, and the
question is answered by the same ``slice`` call apps make (policy, consent and
visibility gates included). Nothing is written to storage directly.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from benchmarks.bench_common import BenchSlice, BenchTurn, SliceItemRef
from domain.values import Interaction
from policies import CasbinAuthorizer
from policies.rules import PolicyRule
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.settings import Settings

APP = "app:bench"
AGENT = "agent:bench"
PURPOSE = "benchmark"
CAPTURE_BATCH = 1_000


def bench_interaction(turn: BenchTurn) -> Interaction:
    """One benchmark turn as the capture apps would send (SPEC §1: actor, dia_id, session)."""
    return Interaction(
        app_id=APP,
        agent_id=AGENT,
        occurred_at=turn.occurred_at,
        user_input=turn.content,
        actor=turn.actor,
        source_ref=turn.source_ref,
        session_id=f"session-{turn.session}",
        purpose=PURPOSE,
        sharing="shared",
    )


def bench_authorizer(purposes: tuple[str, ...] = (PURPOSE,)) -> CasbinAuthorizer:
    """The seed policy plus: the benchmark app may read and capture every category.

    Capture matters too: extraction keeps only the categories the capturing app may
    capture, so without it no attribute, intent or memory would be derived.
    """
    authorizer = CasbinAuthorizer.seeded()
    for purpose in purposes:
        for action in ("read", "capture"):
            authorizer.add_rule(PolicyRule(APP, "default", action, "any", purpose))
    return authorizer


class UprofBenchSystem:
    """One throwaway SQLite deployment; each subject key becomes one data subject."""

    def __init__(
        self, *, embedder: str = "minilm", lexical_only: bool = False, torch_threads: int = 1
    ) -> None:
        """``torch_threads``: the harness's thread count, so uprof's embedder runs with
        the same number as the baselines' (0 leaves torch's default)."""
        self.name = "uprof-lexical" if lexical_only else "uprof"
        self._dir = Path(tempfile.mkdtemp(prefix="uprof-bench-"))
        self._lexical = lexical_only
        self.kernel: Uprof = bootstrap(
            Settings(
                data_dir=self._dir / "data",
                embedder=embedder,
                torch_threads=torch_threads,
            ),
            authorizer=bench_authorizer(),
        )

    def ingest(self, subject_key: str, turns: Sequence[BenchTurn]) -> None:
        k = self.kernel
        k.grant_consent(subject_key, app_id=APP, categories=["*"], purposes=[PURPOSE])
        interactions = [bench_interaction(t) for t in turns]
        for lo in range(0, len(interactions), CAPTURE_BATCH):
            k.capture_many(subject_key, interactions[lo : lo + CAPTURE_BATCH])
        k.process()

    def slice(self, subject_key: str, query: str, budget_tokens: int, now: datetime) -> BenchSlice:
        result = self.kernel.slice(
            subject_key,
            query,
            budget_tokens=budget_tokens,
            purpose=PURPOSE,
            app_id=APP,
            agent_id=AGENT,
            now=now,
            lexical_only=self._lexical,
        )
        return BenchSlice(
            text=result.text,
            items=tuple(SliceItemRef(source_refs=i.source_refs) for i in result.items),
        )

    def forget(self, subject_key: str) -> None:
        """Drop the subject's in-memory slice caches (PrefEval makes thousands of subjects)."""
        self.kernel.flush_caches(self.kernel.stream_of(subject_key))

    def close(self) -> None:
        self.kernel.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def make_uprof(torch_threads: int = 1) -> UprofBenchSystem:
    return UprofBenchSystem(torch_threads=torch_threads)


def make_uprof_lexical(torch_threads: int = 1) -> UprofBenchSystem:
    return UprofBenchSystem(embedder="hashing", lexical_only=True, torch_threads=torch_threads)


def make_uprof_mpnet(torch_threads: int = 1) -> UprofBenchSystem:
    return UprofBenchSystem(embedder="mpnet", torch_threads=torch_threads)


#: The uprof variants the CLI can put beside the baselines, by name.
UPROF_SYSTEMS = {
    "uprof": make_uprof,
    "uprof-lexical": make_uprof_lexical,
    "uprof-mpnet": make_uprof_mpnet,
}
