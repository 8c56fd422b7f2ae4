"""0216-review-of-0211-to-0214's data folder links (TC, TD) attacked
(0219-review-of-0216-and-tf): a link on the way in a folder another user may write
(bug TY), a link swapped between its owner's look and its read, a relative link, a link
loop. Real ``uprof`` processes on SQLite where a start is what is judged; the folders
given to another user need root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import audit.lockfile
from audit.lockfile import DataFolderRefusedError, data_folder_target
from tests.kernel.test_data_folder_links import _ROOT, _STRANGER, _cli, _said
from uprof.settings import Settings


def _two_of_my_volumes_linked_from(shared: Path, tmp_path: Path) -> tuple[Path, Path]:
    """``shared/data`` -> this user's ``prod`` and ``shared/old`` -> this user's ``old``
    (both links this user's own, as the rule wants); the two volumes."""
    prod, old = tmp_path / "prod", tmp_path / "old"
    for volume in (prod, old):
        volume.mkdir(mode=0o700)
    (shared / "data").symlink_to(prod)
    (shared / "old").symlink_to(old)
    return prod, old


@pytest.mark.skipif(not _ROOT, reason="a folder open to another user needs root to say so")
def test_ty_a_link_in_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    """Bug TY: every link on the way was held to its owner (TD, QC), never to the folder
    it sits in. In a folder others may write (no sticky bit) another user renames this
    user's links among themselves: ``old`` moved onto ``data`` is still a link of this
    user's, so the start followed it and opened its stores in the old volume (a copy of
    last year's data, another deployment's): the folders above a link choose the folder
    as much as the link itself. Refused now, before any store is made."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    prod, old = _two_of_my_volumes_linked_from(shared, tmp_path)
    os.rename(shared / "old", shared / "data")  # what the other user may do here
    done = _cli(shared / "data", "--key-dir", str(tmp_path / "keys"), "apps", "list")
    said = _said(done)
    assert done.returncode != 0, said
    assert f"refused the data folder {shared / 'data'}" in said, said
    assert "writable by other users" in said and "Traceback" not in said
    assert not (old / "events.sqlite").exists() and not (prod / "events.sqlite").exists()


@pytest.mark.skipif(not _ROOT, reason="a folder of another user's needs root")
def test_ty_a_link_on_the_way_in_a_folder_of_another_users_is_refused(tmp_path: Path) -> None:
    """The same when a link on the way sits in another user's folder (0755: theirs to
    change), the data folder below it. (A link that is the configured folder itself, in
    its folder owner's folder, is that owner's choice by the rule: root running a
    service user's deployment.)"""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    prod, _ = _two_of_my_volumes_linked_from(theirs, tmp_path)
    os.chown(theirs, _STRANGER, _STRANGER)
    data = theirs / "data" / "uprof"
    done = _cli(data, "--key-dir", str(tmp_path / "keys"), "apps", "list")
    said = _said(done)
    assert done.returncode != 0, said
    assert f"refused the data folder {data}" in said, said
    assert f"owned by uid {_STRANGER}, who could replace it" in said
    assert not (prod / "uprof").exists()


@pytest.mark.skipif(not _ROOT, reason="a folder open to another user needs root to say so")
def test_ty_the_key_folder_through_a_link_in_a_folder_others_may_write_is_refused(
    tmp_path: Path,
) -> None:
    """The key folder's rule is the same code (``_folder_target``): its master secret read
    from, and its next key ring written to, the folder the other user chose."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    _two_of_my_volumes_linked_from(shared, tmp_path)
    with pytest.raises(ValueError, match=r"refused the key folder .*writable by other users"):
        Settings(data_dir=tmp_path / "data", key_dir=shared / "data")


@pytest.mark.skipif(not _ROOT, reason="a folder open to another user needs root to say so")
def test_ty_a_link_swapped_between_its_owners_look_and_its_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk looks at a link's owner (``lstat``), then reads it (``readlink``): another
    user who may write its folder swaps it between the two (forced here at that moment,
    as a looping renamer would now and then). Their link read under this user's owner
    was followed on main; the folder it sits in is refused now, whatever was read."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    theirs = tmp_path / "their-pick"
    theirs.mkdir(mode=0o700)
    (shared / "data").symlink_to(tmp_path / "prod")
    (tmp_path / "prod").mkdir(mode=0o700)
    (shared / "swap").symlink_to(theirs)
    os.lchown(shared / "swap", _STRANGER, _STRANGER)
    real_readlink = os.readlink

    def swapped_first(path: object, *args: object, **kwargs: object) -> str:
        if (shared / "swap").is_symlink():
            os.rename(shared / "swap", shared / "data")
        return real_readlink(path, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(audit.lockfile.os, "readlink", swapped_first)
    try:
        resolved = data_folder_target(shared / "data")
    except DataFolderRefusedError as refused:
        assert "writable by other users" in str(refused), refused
    else:
        pytest.fail(f"followed to {resolved}")


# ------------------------------------------------------------------ held


def test_held_a_relative_link_is_followed_from_its_own_folder(tmp_path: Path) -> None:
    """A link whose target is relative resolves from the link's folder (as the kernel
    does), not from the process's working folder."""
    (tmp_path / "volumes" / "prod").mkdir(parents=True, mode=0o700)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "data").symlink_to(Path("..") / "volumes" / "prod")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    done = _cli(
        tmp_path / "etc" / "data",
        "--key-dir",
        str(tmp_path / "keys"),
        "init",  # a command that makes a deployment (0237-the-wrong-folder)
        cwd=elsewhere,
    )
    assert done.returncode == 0, _said(done)
    assert (tmp_path / "volumes" / "prod" / "events.sqlite").exists()
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("loop", ["self", "pair"])
def test_held_a_link_loop_is_refused_as_such(tmp_path: Path, loop: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    if loop == "self":
        a.symlink_to(a)
    else:
        a.symlink_to(b)
        b.symlink_to(a)
    done = _cli(a / "data", "--key-dir", str(tmp_path / "keys"), "apps", "list")
    said = _said(done)
    assert done.returncode == 2, said  # a configuration refused, before anything is opened
    assert "its links loop" in said and "Traceback" not in said


def test_held_a_link_in_tmps_sticky_folder_is_followed(tmp_path: Path) -> None:
    """The sticky bit keeps others from renaming this user's links (as ``/tmp``'s): a
    link there is followed."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (tmp_path / "prod").mkdir(mode=0o700)
    (sticky / "data").symlink_to(tmp_path / "prod")
    assert data_folder_target(sticky / "data") == tmp_path / "prod"
    assert stat.S_ISLNK(os.lstat(sticky / "data").st_mode)
