"""Memory heat (MemoryOS): how alive a memory is, from use and recency.

heat = alpha * visits + beta * interactions + gamma * exp(-hours_since_last_touch / tau)

visits: times the memory was served in a slice; interactions: captures in the
memory's session (its segment's activity); the recency term decays from the
last time it was touched (served, or recorded when never served).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class HeatWeights:
    alpha: float = 1.0
    beta: float = 0.1
    gamma: float = 1.0
    tau_hours: float = 24.0 * 30


def heat(
    *,
    visits: int,
    interactions: int,
    last_touched: datetime,
    now: datetime,
    weights: HeatWeights = HeatWeights(),
) -> float:
    hours = max(0.0, (now - last_touched).total_seconds() / 3600.0)
    recency = math.exp(-hours / weights.tau_hours)
    return weights.alpha * visits + weights.beta * interactions + weights.gamma * recency
