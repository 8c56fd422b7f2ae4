"""What sealing the policy store costs a policy check, a reload and a change (decision
0140-sealed-policy-store).

``python -m benchmarks.policy_seal_bench --backend sqlite --rounds 5 --other ../tree``
from a tree's root: runs this file from this tree and from ``--other`` (a checkout
without the seal, with this file and ``side_by_side.py`` copied in) alternately, each
round a fresh process on a fresh store, and prints per-call medians of each tree and
their ratio. ``--single``: one measurement in this process (what each round runs).

Per call, on the default tenant's policy (seeded, plus ``--warm`` changes):

- ``check_us``: one decision with a store check on every call (``refresh_s = 0``: the
  worst case of the staleness bound; the default checks at most every 0.25 s). The seal
  adds nothing here: the check compares the store's highest notification id;
- ``reload_ms``: ``PolicyService.current_rows()``, the load a process does when another
  changed the policy: the seal adds one key-store read (the anchor), one read of the
  anchored row, and one HMAC per row read;
- ``change_ms``: one ``policy_grant`` or ``policy_revoke`` of one rule (load, event
  saved, audit entry, reload): the seal adds the load's checks, one HMAC on write, and
  the anchor's raise after the commit (one key-store read, one row read, one write).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.side_by_side import side_by_side_main


def _per_call(fn: Callable[[], Any], calls: int, scale: float) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * scale


def single(backend: str, calls: int, warm: int) -> dict[str, float]:
    from benchmarks.reliability import kernel_on, temp_target
    from domain.principal import Principal
    from uprof.facade import Facade

    with temp_target(backend) as target, kernel_on(target) as kernel:
        facade = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
        rule = {
            "role": "role:assistant",
            "actions": ["read"],
            "categories": ["health"],
            "purpose": "personalization",
        }
        turn = [0]

        def change() -> Any:
            turn[0] += 1
            return (facade.policy_grant if turn[0] % 2 else facade.policy_revoke)(**rule)

        for _ in range(warm):
            change()
        authorizer = kernel.policy.authorizer
        authorizer.refresh_s = 0.0
        tenant = kernel.subjects.tenant

        def check() -> Any:
            return authorizer.decide(
                app_id="app:planner",
                tenant=tenant,
                action="read",
                category="diet",
                purpose="personalization",
            )

        check()
        return {
            "check_us": _per_call(check, calls * 10, 1e6),
            "reload_ms": _per_call(kernel.policy.current_rows, calls, 1e3),
            "change_ms": _per_call(change, calls, 1e3),
        }


def main() -> None:
    side_by_side_main("benchmarks.policy_seal_bench", __doc__, single, calls=100)


if __name__ == "__main__":
    main()
