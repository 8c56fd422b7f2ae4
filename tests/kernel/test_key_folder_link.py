"""A key folder configured through a symbolic link (review of decisions 0198-0200).

Bug PY: decision 0200 refused every key folder whose configured path is a link, the
common way to point ``UPROF_KEY_DIR`` at a mounted volume. A link whose target passes
every check of a key folder gives nobody anything: who made the link must be this user
(or the folder's owner), and the target is a folder of this user's no one else may
write. So it is now followed once, at start (the settings resolve it), and the resolved
path is the one every later open uses; a link to a folder that fails the checks, a link
made by another user and a link to nothing are refused. Files only: PostgreSQL keeps
the same key folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests import children
from tests.conftest import Backend
from tests.kernel.conftest import cli_env, settings_for
from tests.kernel.test_lock_turns_review import sqlite_store  # noqa: F401 (a fixture)
from tests.kernel.test_schema_lock_wait import HARNESS_WAIT_S, _flat
from uprof.bootstrap import build_key_material
from uprof.settings import Settings
from uprof.storage import layout_for


def _linked_key_folder(store: Backend, tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """The deployment ``store``'s key folder moved to a "volume" and its configured path
    made a link to it: (the CLI's environment, the link, the volume's folder)."""
    env = cli_env(store)
    configured = settings_for(store).key_path
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o700)
    target = volume / "keys"
    configured.rename(target)
    configured.symlink_to(target)
    return env, configured, target


def _lag(env: dict[str, str]) -> tuple[int, str]:
    done = children.run_python(
        children.CLI_SCRIPT, "projections", "lag", env=env, timeout=HARNESS_WAIT_S
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, "".join(_flat(done.stderr).split())


def test_py_a_key_folder_reached_through_a_link_is_used(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """Bug PY. main at 8c1c0862: exit 1, "refused the key folder ...: it is a symbolic
    link", though the link's target is the deployment's own key folder."""
    env, link, target = _linked_key_folder(sqlite_store, tmp_path)
    code, said = _lag(env)
    assert code == 0, said
    assert link.is_symlink() and os.readlink(link) == str(target), "the link was replaced"
    assert (target / "master.key").exists() and (target / "keys.sqlite").exists()


@pytest.mark.parametrize("target_kind", ["writable-by-others", "another-users"])
def test_py_held_a_link_to_a_folder_that_fails_the_checks_is_refused(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
    tmp_path: Path,
    target_kind: str,
) -> None:
    """Held: following the link checks its target as any key folder (0200's PR)."""
    env, _, target = _linked_key_folder(sqlite_store, tmp_path)
    if target_kind == "writable-by-others":
        target.chmod(0o777)
        why = "writablebyotherusers(mode0777)"
    else:
        os.chown(target, 4242, 4242)
        why = "ownedbyuid4242"
    code, said = _lag(env)
    assert code == 1, said
    assert f"refusedthekeyfolder{target}:itis{why}" in said, said


def test_py_a_link_another_user_made_is_refused(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """Bug PY's rule: whoever made the link chose the folder (a folder of this user's, but
    maybe another deployment's): a link owned by another user is not followed; exit 2
    naming the setting, nothing created."""
    env, link, _ = _linked_key_folder(sqlite_store, tmp_path)
    os.lchown(link, 4242, 4242)
    code, said = _lag(env)
    assert code == 2, said
    assert "UPROF_KEY_DIR" in said or "configuration" in said, said
    assert f"refusedthekeyfolder{link}:itisasymboliclinkownedbyuid4242" in said, said


def test_py_a_link_to_nothing_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    """A link to a volume not mounted: following it would make the key folder (and new
    keys) on whatever file system is there. Refused naming it; nothing created."""
    link = tmp_path / "keys"
    missing = tmp_path / "volume" / "keys"
    link.symlink_to(missing)
    with pytest.raises(ValidationError, match="it is a symbolic link to nothing"):
        Settings(data_dir=tmp_path / "data", key_dir=link, embedder="hashing")
    assert not missing.exists() and not missing.parent.exists()


def test_py_a_link_swapped_under_a_running_process_redirects_nothing(tmp_path: Path) -> None:
    """Bug PY's other half: the link is resolved once. A process's key store and its
    keys.sqlite stay in the folder the link named when it started, whatever the link
    names later (another folder of this user's that passes every check)."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir(mode=0o700)
        (folder / "master.key").write_bytes(folder.name.encode() * 8)
        (folder / "master.key").chmod(0o600)
    link = tmp_path / "keys"
    link.symlink_to(first)
    settings = Settings(data_dir=tmp_path / "data", key_dir=link, embedder="hashing")
    material = build_key_material(settings)
    assert material.master_secret() == b"first" * 8
    link.unlink()
    link.symlink_to(second)
    assert material.master_secret() == b"first" * 8
    material.load_kek_ring()  # a first KEK ring: made where the process started
    assert (first / "keks.json").exists() and not (second / "keks.json").exists()
    assert layout_for(settings).keys_url == f"sqlite:///{first / 'keys.sqlite'}"
