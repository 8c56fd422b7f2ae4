"""The public surface of policies/ and the direction of its imports."""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

import policies

EXPECTED_PUBLIC_NAMES = [
    "ACTIONS",
    "ALLOW",
    "ANY_PURPOSE",
    "DENY",
    "ROOT_CATEGORY",
    "AccessDecision",
    "CacheStats",
    "CasbinAuthorizer",
    "PolicyDeniedError",
    "PolicyError",
    "PolicyRule",
    "PolicyTableRow",
    "RoleAssignment",
    "copy_seed_policy",
    "is_visible",
    "packaged_model_text",
    "packaged_seed_policy_text",
]
FORBIDDEN_ROOTS = {"uprof", "projections", "audit"}


def test_public_surface_is_unchanged() -> None:
    assert policies.__all__ == EXPECTED_PUBLIC_NAMES
    assert all(hasattr(policies, name) for name in policies.__all__)


def test_package_data_ships_with_the_package() -> None:
    folder = resources.files("policies")
    for name in ("py.typed", "model.conf", "seed_policy.csv"):
        assert folder.joinpath(name).is_file()


def test_policies_imports_only_downwards() -> None:
    folder = Path(policies.__file__).parent
    imported: set[str] = set()
    for source in folder.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert "casbin" in imported and "domain" in imported  # the scan sees real imports
    assert imported.isdisjoint(FORBIDDEN_ROOTS)
