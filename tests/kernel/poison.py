"""A poison capture: one whose extraction raises on every attempt (for the quarantine tests).

``PoisonExtractor`` wraps an extractor and raises ``RuntimeError`` for every capture whose
text holds ``POISON`` (while ``poisoned`` is true), counting its attempts per capture. In a
child process, ``patch_rules(log)`` makes the deployment's own rule-based extractor do the
same, appending one line per attempt to ``log`` (a file: attempts are counted across
processes), and ``UPROF_POISON_EXIT_AT=N`` makes the N-th attempt in that process end it
with ``os._exit(9)`` (a SIGKILL leaves no more cleanup than that) mid-retry.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from domain.values import CapturedInteraction, ProposalBatch

MARK = "POISON"


class PoisonError(RuntimeError):
    """What the poisoned extractor raises (its message quotes the capture, as a careless
    extractor's might: nothing may copy it anywhere)."""


class PoisonExtractor:
    name = "poison"

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.poisoned = True
        self.attempts: Counter[str] = Counter()

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        if MARK in capture.interaction.user_input:
            self.attempts[capture.capture_id] += 1
            if self.poisoned:
                raise PoisonError(f"cannot read {capture.interaction.user_input!r}")
        result: ProposalBatch = self.inner.extract(capture)
        return result


def patch_rules(log: str) -> Callable[[], None]:
    """Make ``RuleBasedExtractor`` (what ``uprof worker`` builds) raise for a poison
    capture; returns what undoes it."""
    from uprof.adapters.extraction import RuleBasedExtractor

    plain = RuleBasedExtractor.extract
    exit_at = int(os.environ.get("UPROF_POISON_EXIT_AT", "0"))
    seen = [0]

    def extract(self: Any, capture: CapturedInteraction) -> ProposalBatch:
        if MARK in capture.interaction.user_input:
            seen[0] += 1
            with Path(log).open("a") as out:
                out.write(f"{os.getpid()} {capture.capture_id}\n")
            if exit_at and seen[0] >= exit_at:
                os._exit(9)
            raise PoisonError(f"cannot read {capture.interaction.user_input!r}")
        result: ProposalBatch = plain(self, capture)
        return result

    RuleBasedExtractor.extract = extract  # type: ignore[method-assign]

    def undo() -> None:
        RuleBasedExtractor.extract = plain  # type: ignore[method-assign]

    return undo


def count_batches(folder: str) -> None:
    """Make ``Uprof.process_once`` (the worker loop's step) write, after each call, how many
    this process has finished to ``folder/<pid>``: a test can then wait until every worker
    has finished a batch it began after a given moment, instead of sleeping."""
    from uprof.kernel import Uprof

    plain = Uprof.process_once
    mine = Path(folder) / str(os.getpid())
    done = [0]

    def process_once(self: Any) -> int:
        try:
            return plain(self)
        finally:
            done[0] += 1
            written = mine.with_suffix(".new")
            written.write_text(str(done[0]))
            written.replace(mine)  # a reader never sees half a number

    Uprof.process_once = process_once  # type: ignore[method-assign]
