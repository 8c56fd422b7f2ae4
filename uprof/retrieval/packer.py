"""Budgeted selection: maximise utility subject to tok(S) <= B.

UProf's S* = argmax Rel(S, q) s.t. tok(S) <= B is a knapsack with two twists:

* shared overheads: a section header, the legend and each day line are paid
  once, by the first item that needs them, so an item's marginal cost depends
  on what is already chosen;
* diminishing returns: a memory very similar to a chosen one adds little
  (maximal marginal relevance), and a near-duplicate adds nothing.

Greedy by marginal gain per marginal token is the standard answer for such
submodular-with-costs objectives; a fix-up pass closes most of its gap to the
optimum: it tries to bring in each of the best items that did not fit by
dropping chosen items of the lowest value per token, keeps the trade when the
total rises, and refills what is left. Choices sharing an ``owner`` are
alternatives (an intent in full or summarised): at most one of them is taken.

All bookkeeping is incremental (marginal costs, similarity to the chosen set,
availability), so one greedy step is a handful of vector operations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: How many of the best unchosen items the fix-up pass tries to bring in.
SWAP_TRIES = 8
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


@dataclass(frozen=True)
class PackResult:
    """Chosen choices (in the order picked), tokens spent, and duplicates found."""

    chosen: tuple[int, ...]
    spent: int
    duplicate_of: dict[int, int]  # unchosen choice -> chosen choice it nearly repeats


_Snapshot = tuple[
    list[int], int, float, np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[int, float]
]


class _Packing:
    """One packing run: the chosen set and everything derived from it, kept in step."""

    def __init__(self, problem: PackProblem) -> None:
        self.p = problem
        m = len(problem.costs)
        self.chosen: list[int] = []
        self.spent = 0
        self.value = 0.0  # sum of the gains the chosen items had when picked
        self.picked_gain: dict[int, float] = {}
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

    def take(self, j: int, gain: float | None = None) -> None:
        """Choose j; ``gain`` is its current marginal gain when the caller has it."""
        gain = float(self.gains()[j]) if gain is None else gain
        self.chosen.append(j)
        self.picked_gain[j] = gain
        self.value += gain
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

    def drop(self, j: int) -> None:
        self.chosen.remove(j)
        self.value -= self.picked_gain.pop(j)
        self.available[self.p.owner == self.p.owner[j]] = True
        self.spent -= int(self.p.costs[j])
        for g in self.p.groups[j].tolist():
            if g >= 0:
                self.group_users[g] -= 1
                if self.group_users[g] == 0:
                    self.spent -= int(self.p.group_costs[g])
                    self.extra[self.members[g]] += self.p.group_costs[g]
        if self.p.similar_to is not None:
            cols = [self.column(c) for c in self.chosen]
            self.max_sim = np.max(cols, axis=0) if cols else np.zeros(len(self.p.costs))
            self._gains = None

    # -- views ----------------------------------------------------------------------

    def gains(self) -> np.ndarray:
        """Marginal relevance: utility discounted by similarity to the chosen set.

        Recomputed only when the chosen set's similarity changed (greedy steps ask often).
        """
        if self._gains is None:
            similarity = np.minimum(np.maximum(self.max_sim, 0.0), 1.0)
            self._gains = self.p.utility * (1.0 - self.p.mmr_penalty * similarity)
        return self._gains

    def duplicates(self) -> np.ndarray:
        return self.max_sim >= self.p.duplicate_threshold

    def room(self) -> int:
        return self.p.budget - self.spent

    def snapshot(self) -> _Snapshot:
        return (
            list(self.chosen),
            self.spent,
            self.value,
            self.group_users.copy(),
            self.extra.copy(),
            self.max_sim.copy(),
            self.available.copy(),
            dict(self.picked_gain),
        )

    def restore(self, snap: _Snapshot) -> None:
        (chosen, self.spent, self.value, self.group_users, self.extra, self.max_sim,
         self.available, gains) = snap  # fmt: skip
        self.chosen, self.picked_gain = chosen, gains
        self._gains = None


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


def _greedy(state: _Packing) -> None:
    """Add the best gain-per-token choice that fits, until none fits or none gains."""
    while True:
        gains = state.gains()
        ok = state.available & (state.extra <= state.room()) & (gains > 0) & ~state.duplicates()
        if not ok.any():
            return
        ratio = np.where(ok, gains / np.maximum(state.extra, 1), -np.inf)
        best = int(np.argmax(ratio))  # first maximum: ties go to the better-ranked choice
        state.take(best, float(gains[best]))


def _try_swap(state: _Packing, newcomer: int) -> bool:
    """Bring newcomer in by dropping the chosen items worth least per token, if the total rises.

    The total is the sum of the gains items had when picked: an approximation
    under MMR (a drop does not re-credit items it had discounted), which only
    makes the pass more reluctant to swap.
    """
    p = state.p
    before = state.value
    snap = state.snapshot()
    # Chosen items, worst value per token first (ties: the later choice first).
    chosen = np.asarray(state.chosen, dtype=np.int64)
    worth = np.asarray([state.picked_gain[j] for j in state.chosen]) / np.maximum(
        p.costs[chosen], 1
    )
    by_value = chosen[np.lexsort((-chosen, worth))].tolist()
    for j in by_value:
        if state.extra[newcomer] <= state.room():
            break
        state.drop(j)
    if state.available[newcomer] and state.extra[newcomer] <= state.room():
        state.take(newcomer)
        _greedy(state)
        if state.value > before + 1e-12:
            return True
    state.restore(snap)
    return False


def pack(problem: PackProblem) -> PackResult:
    """Choose choices whose lines and overheads fit the budget, maximising marginal utility."""
    m = len(problem.costs)
    if m == 0 or problem.budget <= 0:
        return PackResult((), 0, {})
    state = _Packing(problem)
    _greedy(state)
    tries = 0
    for j in np.lexsort((np.arange(m), -problem.utility)).tolist():
        if tries >= SWAP_TRIES or problem.utility[j] <= 0:
            break
        if not state.available[j] or state.duplicates()[j]:
            continue
        tries += 1
        _try_swap(state, j)
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
