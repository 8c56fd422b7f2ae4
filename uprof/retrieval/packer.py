"""Budgeted selection: the most relevant items that fit, never traded for cheap ones.

UProf's S* = argmax Rel(S, q) s.t. tok(S) <= B, with two twists:

* shared overheads: a section header, the legend and each day line are paid
  once, by the first item that needs them, so an item's marginal cost depends
  on what is already chosen;
* diminishing returns: a memory very similar to a chosen one adds little
  (maximal marginal relevance), and a near-duplicate adds nothing.

The selection is rank-order first-fit on marginal relevance: repeatedly take the
choice with the highest gain (utility discounted by similarity to the chosen set)
among those that still fit, until none fits. It is not gain per token: a knapsack
on utility per token lets several short, weakly relevant lines (0.25 each at 10
tokens) crowd out one clearly relevant answer (1.0 at 71 tokens), and that is the
answer the caller needed (issue 15: 16 of 22 single-hop misses at B=1024). So the
guarantee is: an item is left out for budget only when it did not fit in what the
more relevant chosen items left. Shorter items still fill the room a long one
cannot use. Choices sharing an ``owner`` are alternatives (an intent in full or
summarised): at most one of them is taken.

All bookkeeping is incremental (marginal costs, similarity to the chosen set,
availability), so one step is a handful of vector operations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Similarity columns fetched up front for the most useful choices, when fetching
#: many at once is cheaper (lexical pools): greedy takes mostly from the top.
PREFETCH_COLUMNS = 96


#: Similarity of every choice to choice j (an (m,) vector), computed only when j is chosen.
SimilarTo = Callable[[int], np.ndarray]


@dataclass(frozen=True)
class PackProblem:
    """Choices, their costs and utilities, the overhead groups they need, and the budget."""

    costs: np.ndarray  # (m,) tokens of the choice's own line
    utility: np.ndarray  # (m,) value of the choice alone
    owner: np.ndarray  # (m,) candidate each choice renders; one choice per owner
    groups: np.ndarray  # (m, k) overhead groups each choice needs, -1 for none
    group_costs: np.ndarray  # (g,) tokens of each overhead line
    similar_to: SimilarTo | None  # similarity column for MMR, or None
    budget: int
    #: The same columns for many choices at once, (m, len(js)); None when not cheaper.
    similar_to_many: Callable[[np.ndarray], np.ndarray] | None = None
    mmr_penalty: float = 0.5
    duplicate_threshold: float = 0.95
    #: At most this many choices are taken (None: as many as fit).
    max_chosen: int | None = None


@dataclass(frozen=True)
class PackResult:
    """Chosen choices (in the order picked), tokens spent, and duplicates found."""

    chosen: tuple[int, ...]
    spent: int
    duplicate_of: dict[int, int]  # unchosen choice -> chosen choice it nearly repeats


class _Packing:
    """One packing run: the chosen set and everything derived from it, kept in step."""

    def __init__(self, problem: PackProblem) -> None:
        self.p = problem
        m = len(problem.costs)
        self.chosen: list[int] = []
        self.spent = 0
        self.group_users = np.zeros(len(problem.group_costs), dtype=np.int64)
        # Marginal cost: own line plus every overhead line that nobody has paid yet.
        self.extra = problem.costs.astype(np.int64).copy()
        self.members = _members(problem.groups, len(problem.group_costs))
        for column in problem.groups.T:
            needs = column >= 0
            self.extra[needs] += problem.group_costs[column[needs]]
        self.available = np.ones(m, dtype=bool)
        self.columns: dict[int, np.ndarray] = {}  # similarity to each choice ever chosen
        self.max_sim = np.zeros(m)
        self._gains: np.ndarray | None = None  # gains() for the current max_sim
        if problem.similar_to_many is not None and m:
            top = np.argsort(-problem.utility, kind="stable")[:PREFETCH_COLUMNS]
            block = np.ascontiguousarray(problem.similar_to_many(top).T)
            self.columns.update(zip(top.tolist(), block, strict=True))

    def column(self, j: int) -> np.ndarray:
        if j not in self.columns:
            assert self.p.similar_to is not None
            self.columns[j] = np.asarray(self.p.similar_to(j), dtype=np.float64)
        return self.columns[j]

    # -- moves ----------------------------------------------------------------------

    def take(self, j: int) -> None:
        """Choose j: pay its line and any overhead not yet paid, discount what resembles it."""
        self.chosen.append(j)
        self.spent += int(self.extra[j])
        self.available[self.p.owner == self.p.owner[j]] = False
        for g in self.p.groups[j].tolist():
            if g >= 0:
                self.group_users[g] += 1
                if self.group_users[g] == 1:  # just paid: cheaper for everyone needing it
                    self.extra[self.members[g]] -= self.p.group_costs[g]
        if self.p.similar_to is not None:
            np.maximum(self.max_sim, self.column(j), out=self.max_sim)
            self._gains = None

    # -- views ----------------------------------------------------------------------

    def gains(self) -> np.ndarray:
        """Marginal relevance: utility discounted by similarity to the chosen set.

        Recomputed only when the chosen set's similarity changed (every step asks).
        """
        if self._gains is None:
            similarity = np.minimum(np.maximum(self.max_sim, 0.0), 1.0)
            self._gains = self.p.utility * (1.0 - self.p.mmr_penalty * similarity)
        return self._gains

    def duplicates(self) -> np.ndarray:
        return self.max_sim >= self.p.duplicate_threshold

    def room(self) -> int:
        return self.p.budget - self.spent


def _members(groups: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """For each overhead group, the choices that need it (one sort instead of a scan per group)."""
    m, k = groups.shape
    flat = groups.ravel()
    owners = np.repeat(np.arange(m), k)
    valid = flat >= 0
    flat, owners = flat[valid], owners[valid]
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=n_groups)
    return np.split(owners[order], np.cumsum(counts)[:-1]) if n_groups else []


def _first_fit(state: _Packing) -> None:
    """Take the highest-gain choice that fits, until none fits, none gains or the most
    choices allowed are taken."""
    limit = state.p.max_chosen
    while limit is None or len(state.chosen) < limit:
        gains = state.gains()
        ok = state.available & (state.extra <= state.room()) & (gains > 0) & ~state.duplicates()
        if not ok.any():
            return
        best = int(np.argmax(np.where(ok, gains, -np.inf)))  # ties: the better-ranked choice
        state.take(best)


def pack(problem: PackProblem) -> PackResult:
    """Choose choices whose lines and overheads fit the budget, most relevant first."""
    m = len(problem.costs)
    if m == 0 or problem.budget <= 0:
        return PackResult((), 0, {})
    state = _Packing(problem)
    _first_fit(state)
    return PackResult(tuple(state.chosen), state.spent, _duplicates(state))


def _duplicates(state: _Packing) -> dict[int, int]:
    """Unchosen choices that nearly repeat a chosen one, mapped to the one they repeat."""
    if state.p.similar_to is None or not state.chosen:
        return {}
    sims = np.stack([state.column(c) for c in state.chosen], axis=1)
    best = sims.argmax(axis=1)
    chosen_set = set(state.chosen)
    out: dict[int, int] = {}
    for j in np.flatnonzero(sims.max(axis=1) >= state.p.duplicate_threshold).tolist():
        if j not in chosen_set:
            out[j] = state.chosen[int(best[j])]
    return out
