"""A store at its branch head opens without alembic; anything else still migrates.

``uprof.storage.branch_head`` reads the revision files' headers instead of importing
alembic (every CLI command opens two stores). It must agree with alembic, and say
"don't know" (None, so alembic decides) for any shape it does not follow.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from tests.conftest import Backend
from uprof import storage
from uprof.storage import MIGRATIONS_DIR, branch_head, create_engine, migrate


@pytest.mark.parametrize("branch", ["views", "keys", "events"])
def test_the_head_read_from_the_files_is_alembics(branch: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    expected = ScriptDirectory.from_config(config).get_revision(f"{branch}@head")
    assert expected is not None
    assert branch_head(branch) == expected.revision


def _copy_versions(tmp_path: Path) -> Path:
    target = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR / "versions", target / "versions")
    return target


def test_a_branch_that_forks_is_left_to_alembic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy_versions(tmp_path)
    # A second child of the views head: two heads, which the plain reading does not follow.
    (folder / "versions" / "9999_fork.py").write_text(
        'revision = "9999_fork"\ndown_revision = "0003_views_idem_sealed"\nbranch_labels = None\n'
    )
    monkeypatch.setattr(storage, "MIGRATIONS_DIR", folder)
    assert branch_head("views") is None
    assert branch_head("keys") == "0006_keys_destroyed_keys"  # the other branch is unaffected


def test_a_header_written_another_way_is_left_to_alembic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy_versions(tmp_path)
    (folder / "versions" / "9999_merge.py").write_text(
        'revision = "9999_merge"\ndown_revision = ("0003_keys_api_key_tenant", "0004_x")\n'
    )
    monkeypatch.setattr(storage, "MIGRATIONS_DIR", folder)
    assert branch_head("keys") is None


def test_a_store_behind_its_head_is_migrated_and_one_at_head_is_left_alone(
    empty_backend: Backend,
) -> None:
    engine = create_engine(empty_backend.url)
    try:
        migrate(engine, "views")
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["branch"] = "views"
        with engine.begin() as conn:
            # Back to the previous release's schema, as a store it wrote would be.
            config.attributes["connection"] = conn
            command.downgrade(config, "0003_views_idem_sealed")
        assert "categories" not in _memory_columns(engine)
        assert "granted_position" not in _columns(engine, "consents")
        migrate(engine, "views")
        assert "categories" in _memory_columns(engine)
        assert {"granted_position", "withdrawn_position"} <= _columns(engine, "consents")
        assert {"stream_id", "capture_id", "mark"} <= _columns(engine, "erased_keys")
        assert {"session_id", "expires_at"} <= _columns(engine, "signed_out_sessions")
        assert {"bucket", "period_s", "slot", "hits", "expires_at"} <= _columns(
            engine, "rate_limit_slots"
        )
        assert _versions(engine) == {"0008_views_rate_limit_slots"}
        migrate(engine, "views")  # at head: nothing to do
        assert _versions(engine) == {"0008_views_rate_limit_slots"}
    finally:
        engine.dispose()


def _memory_columns(engine: sa.Engine) -> set[str]:
    return _columns(engine, "memories")


def _columns(engine: sa.Engine, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def _versions(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}


def test_a_revision_added_after_a_first_reading_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The headers are read once per process for the same files: a file added (or
    changed) since is a different set of files, read again."""
    folder = _copy_versions(tmp_path)
    monkeypatch.setattr(storage, "MIGRATIONS_DIR", folder)
    head = branch_head("views")
    assert head is not None
    (folder / "versions" / "9999_next.py").write_text(
        f'revision = "9999_next"\ndown_revision = "{head}"\nbranch_labels = None\n'
    )
    assert branch_head("views") == "9999_next"
    (folder / "versions" / "9999_next.py").write_text(
        f'revision = "9999_other"\ndown_revision = "{head}"\nbranch_labels = None\n'
    )
    assert branch_head("views") == "9999_other"
