"""Budgeted selection: maximise utility subject to tok(S) <= B.

UProf's S* = argmax Rel(S, q) s.t. tok(S) <= B is a knapsack with two twists:

* shared overheads: a section header, the legend and each day line are paid
  once, by the first item that needs them, so an item's marginal cost depends
  on what is already chosen;
* diminishing returns: a memory very similar to a chosen one adds little
  (maximal marginal relevance), and a near-duplicate adds nothing.

Greedy by marginal gain per marginal token is the standard answer for such
submodular-with-costs objectives; two fix-ups close most of its gap to the
optimum: a swap pass (trade several cheap low-value choices for one item that
did not fit, when that raises the total) followed by a refill of what is left.
Choices sharing an ``owner`` are alternatives (an intent in full or
summarised): at most one of them is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: How many of the best unchosen items the swap pass tries to bring in.
SWAP_TRIES = 8


@dataclass(frozen=True)
class PackProblem:
    """Choices, their costs and utilities, the overhead groups they need, and the budget."""

    costs: np.ndarray  # (m,) tokens of the choice's own line
    utility: np.ndarray  # (m,) value of the choice alone
    owner: np.ndarray  # (m,) candidate each choice renders; one choice per owner
    groups: np.ndarray  # (m, k) overhead groups each choice needs, -1 for none
    group_costs: np.ndarray  # (g,) tokens of each overhead line
    similarity: np.ndarray | None  # (m, m) pairwise similarity for MMR, or None
    budget: int
    mmr_penalty: float = 0.5
    duplicate_threshold: float = 0.95


@dataclass
class _State:
    """Mutable bookkeeping of one packing run."""

    chosen: list[int] = field(default_factory=list)
    spent: int = 0
    group_users: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    taken_owner: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class PackResult:
    """Chosen choices (in the order picked), tokens spent, and duplicates found."""

    chosen: tuple[int, ...]
    spent: int
    duplicate_of: dict[int, int]  # unchosen choice -> chosen choice it nearly repeats


def _extra_costs(problem: PackProblem, users: np.ndarray) -> np.ndarray:
    """Marginal cost of every choice: its line plus the overhead lines not yet paid."""
    extra = problem.costs.astype(np.int64).copy()
    for column in problem.groups.T:
        needs = column >= 0
        unpaid = needs.copy()
        unpaid[needs] = users[column[needs]] == 0
        extra[unpaid] += problem.group_costs[column[unpaid]]
    return extra


def _max_similarity(problem: PackProblem, chosen: list[int]) -> np.ndarray:
    m = len(problem.costs)
    if problem.similarity is None or not chosen:
        return np.zeros(m)
    return problem.similarity[:, chosen].max(axis=1).astype(np.float64)


def _gains(problem: PackProblem, max_sim: np.ndarray) -> np.ndarray:
    """Marginal relevance: utility discounted by similarity to what is already chosen."""
    return problem.utility * (1.0 - problem.mmr_penalty * np.clip(max_sim, 0.0, 1.0))


def _take(problem: PackProblem, state: _State, j: int, extra: int) -> None:
    state.chosen.append(j)
    state.spent += extra
    state.taken_owner.add(int(problem.owner[j]))
    for g in problem.groups[j]:
        if g >= 0:
            state.group_users[g] += 1


def _drop(problem: PackProblem, state: _State, j: int) -> int:
    """Remove a chosen choice; returns the tokens freed (its line and orphaned overheads)."""
    state.chosen.remove(j)
    state.taken_owner.discard(int(problem.owner[j]))
    freed = int(problem.costs[j])
    for g in problem.groups[j]:
        if g >= 0:
            state.group_users[g] -= 1
            if state.group_users[g] == 0:
                freed += int(problem.group_costs[g])
    state.spent -= freed
    return freed


def _available(problem: PackProblem, state: _State) -> np.ndarray:
    free = np.ones(len(problem.costs), dtype=bool)
    if state.taken_owner:
        free &= ~np.isin(problem.owner, list(state.taken_owner))
    return free


def _is_duplicate(problem: PackProblem, max_sim: np.ndarray) -> np.ndarray:
    return max_sim >= problem.duplicate_threshold


def _greedy(problem: PackProblem, state: _State) -> None:
    """Add the best gain-per-token choice that fits, until none fits or none gains."""
    while True:
        max_sim = _max_similarity(problem, state.chosen)
        gains = _gains(problem, max_sim)
        extra = _extra_costs(problem, state.group_users)
        room = problem.budget - state.spent
        ok = (
            _available(problem, state)
            & (extra <= room)
            & (gains > 0)
            & ~_is_duplicate(problem, max_sim)
        )
        if not ok.any():
            return
        ratio = np.where(ok, gains / np.maximum(extra, 1), -np.inf)
        j = int(np.argmax(ratio))  # first maximum: ties go to the earlier (better-ranked) choice
        _take(problem, state, j, int(extra[j]))


def _try_swap(problem: PackProblem, state: _State, newcomer: int) -> bool:
    """Bring newcomer in by dropping the least valuable chosen items, if the total rises."""
    max_sim = _max_similarity(problem, state.chosen)
    if _is_duplicate(problem, max_sim)[newcomer]:
        return False
    gain = float(_gains(problem, max_sim)[newcomer])
    ratios = [(problem.utility[j] / max(problem.costs[j], 1), j) for j in state.chosen]
    snapshot = (list(state.chosen), state.spent, state.group_users.copy(), set(state.taken_owner))
    lost = 0.0
    for _, j in sorted(ratios):
        need = int(_extra_costs(problem, state.group_users)[newcomer])
        if need <= problem.budget - state.spent:
            break
        lost += float(problem.utility[j])
        if lost >= gain:
            break
        _drop(problem, state, j)
    need = int(_extra_costs(problem, state.group_users)[newcomer])
    owner_free = int(problem.owner[newcomer]) not in state.taken_owner
    if lost < gain and owner_free and need <= problem.budget - state.spent:
        _take(problem, state, newcomer, need)
        return True
    state.chosen, state.spent, state.group_users, state.taken_owner = snapshot
    return False


def pack(problem: PackProblem) -> PackResult:
    """Choose choices whose lines and overheads fit the budget, maximising marginal utility."""
    m = len(problem.costs)
    state = _State(group_users=np.zeros(len(problem.group_costs), dtype=np.int64))
    if m == 0 or problem.budget <= 0:
        return PackResult((), 0, {})
    _greedy(problem, state)
    order = np.lexsort((np.arange(m), -problem.utility))
    tries = 0
    for j in order:
        if tries >= SWAP_TRIES:
            break
        if j in state.chosen or int(problem.owner[j]) in state.taken_owner:
            continue
        tries += 1
        if _try_swap(problem, state, int(j)):
            _greedy(problem, state)
    return PackResult(tuple(state.chosen), state.spent, _duplicates(problem, state.chosen))


def _duplicates(problem: PackProblem, chosen: list[int]) -> dict[int, int]:
    """Unchosen choices that nearly repeat a chosen one, mapped to the one they repeat."""
    if problem.similarity is None or not chosen:
        return {}
    sims = problem.similarity[:, chosen]
    best = sims.argmax(axis=1)
    out: dict[int, int] = {}
    chosen_set = set(chosen)
    for j in np.flatnonzero(sims.max(axis=1) >= problem.duplicate_threshold):
        if int(j) not in chosen_set:
            out[int(j)] = chosen[int(best[j])]
    return out
