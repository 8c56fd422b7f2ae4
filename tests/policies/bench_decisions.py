"""Measure CasbinAuthorizer.decisions_for over the 14 catalogue categories.

Not collected by pytest. Run: ``.venv/bin/python -m tests.policies.bench_decisions``.
Cold runs clear the decision cache before every call, so each of the 14 decisions goes to
Casbin; warm runs repeat one request shape, as a busy slice endpoint does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from domain.values import CATEGORIES
from policies import CasbinAuthorizer

REQUEST = {
    "app_id": "app:planner",
    "tenant": "default",
    "action": "read",
    "purpose": "personalization",
}


def _rate(authorizer: CasbinAuthorizer, *, cold: bool, seconds: float = 2.0) -> float:
    """Return decisions per second for repeated decisions_for calls over CATEGORIES."""
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        if cold:
            authorizer.clear_cache()
        authorizer.decisions_for(**REQUEST, categories=CATEGORIES)
        calls += 1
    return calls * len(CATEGORIES) / elapsed


def _many_tenants(count: int) -> CasbinAuthorizer:
    """The seed copied into count tenants: the rule count a multi-tenant file reaches."""
    seed = CasbinAuthorizer.seeded()
    rows: list[tuple[str, ...]] = []
    for index in range(count):
        tenant = "default" if index == 0 else f"tenant{index}"
        rows += [("p", r.subject, tenant, *r.fields()[2:]) for r in seed.rules()]
        rows += [("g", a.member, a.role, tenant) for a in seed.role_assignments()]
    return CasbinAuthorizer.from_rows(rows)


def main() -> None:
    """Print decisions/s (and slices/s = decisions/s / 14) for each setup."""
    setups: list[tuple[str, Callable[[], CasbinAuthorizer]]] = [
        ("seed policy", CasbinAuthorizer.seeded),
        ("seed x 50 tenants", lambda: _many_tenants(50)),
    ]
    for label, build in setups:
        authorizer = build()
        rules = len(authorizer.rules())
        for cold in (True, False):
            rate = _rate(authorizer, cold=cold)
            mode = "cold (Casbin)" if cold else "warm (cache)"
            print(
                f"{label:<18} {rules:>5} rules  {mode:<14} "
                f"{rate:>10,.0f} decisions/s  {rate / len(CATEGORIES):>9,.0f} slices/s"
            )


if __name__ == "__main__":
    main()
