"""Package rules: table naming, import boundaries, and no mutation paths in the source."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from audit.tables import APPEND_ONLY_TABLES, metadata
from domain.naming import NAMING_CONVENTION

AUDIT_DIR = Path(__file__).resolve().parents[2] / "audit"
REPO = AUDIT_DIR.parent


def test_tables_use_the_shared_naming_convention() -> None:
    # Every table-owning package builds its metadata on the one convention (domain.naming).
    from projections.profile.tables import metadata as profile_metadata
    from uprof.apikeys.tables import metadata as api_metadata
    from uprof.crypto.tables import metadata as keys_metadata
    from uprof.services.idempotency import metadata as idempotency_metadata

    for md in (metadata, profile_metadata, api_metadata, keys_metadata, idempotency_metadata):
        assert {k: md.naming_convention[k] for k in NAMING_CONVENTION} == NAMING_CONVENTION
    assert set(metadata.tables) == {"audit_entries", "audit_nodes", "audit_checkpoints"}
    entries = metadata.tables["audit_entries"]
    index_names = {ix.name for ix in entries.indexes}
    assert index_names == {
        "ix_audit_entries_subject_ref",
        "ix_audit_entries_app_id",
        "ix_audit_entries_action",
        "ix_audit_entries_recorded_at",
    }
    assert entries.primary_key.name == "pk_audit_entries"
    checks = {c.name for c in entries.constraints if isinstance(c, sa.CheckConstraint)}
    assert checks == {"ck_audit_entries_leaf_index_non_negative"}
    assert metadata.tables["audit_nodes"].primary_key.name == "pk_audit_nodes"


def test_append_only_ddl_covers_every_table() -> None:
    from uprof.backends import REGISTRY, backend_named

    assert set(APPEND_ONLY_TABLES) == set(metadata.tables)
    for scheme in REGISTRY:
        ddl = " ".join(backend_named(scheme).append_only_ddl(APPEND_ONLY_TABLES))
        for table in metadata.tables:
            assert f"ON {table}" in ddl
        assert "%" not in ddl
        assert ":" not in ddl.replace("::", "")  # no bound-parameter marks for op.execute
    # A database no backend knows gets no audit log at all (never one without triggers).
    with pytest.raises(ValueError, match="no storage backend"):
        backend_named("mysql")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_audit_imports_only_domain_and_its_allowed_libraries() -> None:
    allowed = {"audit", "domain", "sqlalchemy", "cryptography", "rfc8785", "__future__"}
    stdlib = set(sys.stdlib_module_names)
    for path in AUDIT_DIR.glob("*.py"):
        foreign = _imports(path) - allowed - stdlib
        assert not foreign, f"{path.name} imports {foreign}"
        assert not _imports(path) & {"uprof", "projections", "policies"}


def test_source_has_no_update_or_delete_paths() -> None:
    for path in AUDIT_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in {"delete", "on_conflict_do_update"}, path.name
                if node.func.attr == "update":
                    # Only hash objects are updated (streaming digests), never tables.
                    assert isinstance(node.func.value, ast.Attribute | ast.Name), path.name
                    name = ast.unparse(node.func.value)
                    assert "digest" in name, f"{path.name}: {name}.update()"
            if isinstance(node, ast.Call):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        text = arg.value.upper()
                        assert not text.startswith(("UPDATE ", "DELETE ", "TRUNCATE ")), path.name


def test_benchmark_runs_small(tmp_path: Path, capsys: object) -> None:
    spec = importlib.util.spec_from_file_location(
        "audit_bench", REPO / "benchmarks" / "audit_bench.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (
        module.main(
            ["--entries", "300", "--batch", "100", "--runs", "1", "--workdir", str(tmp_path)]
        )
        == 0
    )
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    result = json.loads(out)
    assert result["entries"] == 300
    assert result["append_entries_per_s"]["median"] > 0
    assert result["verify_entries_per_s"]["median"] > 0


def test_every_public_name_loads_from_its_module_on_first_use() -> None:
    """``audit``'s names load on first use (PEP 562, 0249-cli-start-cost): each name of
    ``__all__`` is there, is its defining module's object, and an unknown name is
    refused as before; a fresh process importing ``audit.lockfile`` (every CLI command's
    settings) loads no SQLAlchemy."""
    import audit

    where = audit._WHERE
    assert set(where) == set(audit.__all__)
    for name in audit.__all__:
        assert getattr(audit, name) is getattr(importlib.import_module(where[name]), name)
        assert name in dir(audit)
    with pytest.raises(AttributeError, match="no_such_name"):
        audit.no_such_name  # noqa: B018
    probe = (
        "import json, sys\n"
        "import audit.lockfile\n"
        "print(json.dumps(sorted(m for m in ('sqlalchemy', 'audit.log', 'audit.export')"
        " if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout) == []
