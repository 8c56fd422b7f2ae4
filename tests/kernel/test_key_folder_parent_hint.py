"""A key folder refused for the folder above it says how to mend that folder (review
of 0203 and 0205, bug RG).

0203's QD refuses a key folder under a folder other users may write (no sticky bit;
group-writable too unless the group is the user's private group, see
test_key_folder_private_group.py). The refusal named the folder and its mode, but its
hint told the operator to ``chmod 700`` the key folder (already 0700) and said nothing of
the folder above. A real CLI process (a first start on SQLite).

That refusal's hint says "nothing was changed", but the start had made the key folder
(empty, 0700) before it checked the folders above, and left it there (bug RW): a refused
start now removes what it made, and only that.
"""

from __future__ import annotations

from pathlib import Path

from tests.kernel.test_review_0141 import _uprof
from uprof.settings import Settings


def test_a_key_folder_under_a_group_writable_folder_is_refused_with_the_remedy(
    tmp_path: Path,
) -> None:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    deploy.chmod(0o777)
    settings = Settings(data_dir=deploy / "data", embedder="hashing")
    done = _uprof(settings, "init")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said
    assert f"it is under {deploy}, writable by other users (mode 0777)" in said, said
    assert "chmod go-w" in said and "folders above it" in said, said
    assert not (deploy / "data").exists(), "a store was made beside a refused key folder"
    assert sorted(deploy.iterdir()) == [], "a refused first start left a folder it made"


def _open_deploy(tmp_path: Path) -> Path:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    deploy.chmod(0o777)
    return deploy


def test_rw_a_refused_first_start_leaves_no_folder_it_made_above_the_key_folder(
    tmp_path: Path,
) -> None:
    """Bug RW: the key folder and the folders made on the way to it (the data folder's
    own parents missing) are all removed; the open folder above was there, and stays."""
    deploy = _open_deploy(tmp_path)
    settings = Settings(data_dir=deploy / "a" / "b" / "data", embedder="hashing")
    done = _uprof(settings, "init")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "writable by other users (mode 0777)" in " ".join(done.stderr.split())
    assert sorted(deploy.iterdir()) == [], "a refused first start left folders it made"
    assert deploy.stat().st_mode & 0o7777 == 0o777


def test_rw_a_key_folder_that_was_there_is_not_removed_by_the_refusal(tmp_path: Path) -> None:
    """Held beside RW: only what this start made is removed; a key folder made before it
    (empty, as one made by a start of an older uprof) stays, as it was."""
    deploy = _open_deploy(tmp_path)
    keys = deploy / "data.keys"
    keys.mkdir(mode=0o700)
    before = keys.stat()
    settings = Settings(data_dir=deploy / "data", embedder="hashing")
    done = _uprof(settings, "init")
    assert done.returncode == 1, done.stdout + done.stderr
    assert sorted(deploy.iterdir()) == [keys]
    after = keys.stat()
    assert (after.st_ino, after.st_mode, after.st_uid) == (
        before.st_ino,
        before.st_mode,
        before.st_uid,
    )
