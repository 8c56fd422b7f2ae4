"""The matcher parsed once per process (decision 0096) decides exactly as pycasbin does.

Attack review of 2026-12-05: the authorizer's enforcer hands pycasbin's evaluator a tree
parsed when the enforcer is built instead of letting ``enforce`` parse the matcher. These
tests compare every decision of the seed policy's matrix (and after changes and a reload)
with an authorizer built on pycasbin's own ``casbin.Enforcer``, and check that a model whose
matcher pycasbin would rewrite per policy row (``eval()``) is refused at start.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import casbin
import pytest

import policies.authorizer as authorizer_module
from domain.values import CATEGORIES
from policies import CasbinAuthorizer, PolicyError, PolicyRule
from policies.rules import ACTIONS

APPS = (
    "app:planner",
    "app:calendar",
    "app:compliance-console",
    "app:privacy-console",
    "operators",
    "app:stranger",
)
PURPOSES = (
    "personalization",
    "scheduling",
    "compliance",
    "erasure",
    "operations",
    "access-request",
    "marketing",
)


def _matrix(tenants: tuple[str, ...] = ("default",)) -> Iterator[dict[str, str]]:
    for app, tenant, action, category, purpose in itertools.product(
        APPS, tenants, ACTIONS, CATEGORIES, PURPOSES
    ):
        yield {
            "app_id": app,
            "tenant": tenant,
            "action": action,
            "category": category,
            "purpose": purpose,
        }


def _differences(
    ours: CasbinAuthorizer, theirs: CasbinAuthorizer, **kw: tuple[str, ...]
) -> list[object]:
    out = []
    # Every third request of the matrix (purposes vary fastest, 7 of them, so each
    # purpose, category, action and app is still met many times): each decision goes to
    # Casbin twice, and the whole matrix took 18.6 s of the suite alone.
    for request in itertools.islice(_matrix(**kw), 0, None, 3):
        mine, reference = ours.decide(**request), theirs.decide(**request)
        assert "engine error" not in reference.reason, (request, reference.reason)
        if mine.allowed != reference.allowed:
            out.append((request, mine, reference))
    return out


def test_the_parsed_once_matcher_decides_the_seed_matrix_as_pycasbin() -> None:
    ours = CasbinAuthorizer.seeded()
    original = authorizer_module._ParsedOnceEnforcer
    authorizer_module._ParsedOnceEnforcer = casbin.Enforcer  # type: ignore[misc]
    try:
        theirs = CasbinAuthorizer.seeded()
        reference_enforcers = [e.enforcer for e in theirs._snapshot.engines.values()]
        assert all(type(e) is casbin.Enforcer for e in reference_enforcers)
        allowed = sum(theirs.is_allowed(**r) for r in _matrix())
        assert allowed > 0, "the matrix holds allowed requests"
        assert _differences(ours, theirs) == []

        # After changes (a deny, a new role, a new tenant) and a reload from rows.
        for auth in (ours, theirs):
            auth.add_rule(PolicyRule("role:assistant", "default", "read", "diet", "*", "deny"))
            auth.assign_role("app:stranger", "role:scheduler", "default")
            auth.assign_role("app:planner", "role:assistant", "t2")
            auth.add_rule(PolicyRule("role:assistant", "t2", "read", "any", "personalization"))
        assert _differences(ours, theirs, tenants=("default", "t2")) == []
        rows = [
            ("p", "role:assistant", "t2", "read", "goal", "personalization", "allow"),
            ("p", "role:assistant", "t2", "capture", "any", "*", "allow"),
            ("p", "role:assistant", "t2", "capture", "health", "*", "deny"),
            ("g", "app:planner", "role:assistant", "t2"),
        ]
        for auth in (ours, theirs):
            auth.reload(rows)
        assert _differences(ours, theirs, tenants=("default", "t2")) == []
    finally:
        authorizer_module._ParsedOnceEnforcer = original  # type: ignore[misc]


def test_a_model_whose_matcher_uses_eval_is_refused_at_start(
    policy_file: Path, model_file: Path
) -> None:
    # pycasbin rewrites an eval() matcher with each policy row's text and evaluates it:
    # the matcher parsed at start would not be the one decided with (each decision would
    # parse, and keep, one expression per row), and a row's text would be run as an
    # expression. uprof's rows are names, never expressions: such a model is refused.
    text = model_file.read_text(encoding="utf-8")
    old = "&& g2(r.cat, p.cat)"
    assert old in text
    model_file.write_text(text.replace(old, "&& eval(p.cat) && g2(r.cat, p.cat)"), encoding="utf-8")
    with pytest.raises(PolicyError, match="eval"):
        CasbinAuthorizer.from_files(model_file, policy_file)
