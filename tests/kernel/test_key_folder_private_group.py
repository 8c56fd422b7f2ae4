"""A key folder under a folder only its user's private group may write is used (the
0775 folders a umask of 002 makes on Debian and Ubuntu, where each user's group is the
user alone); a group with another member, or another user's primary group, is refused as
before (0203's QD, 0207's RG hint). Files only: no database is involved."""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path
from types import SimpleNamespace

import pytest

from audit import lockfile
from audit.lockfile import KeyFileRefusedError, check_key_folder


def _key_folder_under(tmp_path: Path, mode: int) -> Path:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    deploy.chmod(mode)
    keys = deploy / "keys"
    keys.mkdir(mode=0o700)
    return keys


def _alone_in_my_group() -> bool:
    gid = os.getegid()
    return not grp.getgrgid(gid).gr_mem and all(
        user.pw_uid == os.geteuid() for user in pwd.getpwall() if user.pw_gid == gid
    )


@pytest.mark.skipif(not _alone_in_my_group(), reason="this user's group is shared here")
def test_a_key_folder_under_a_0775_folder_of_the_users_private_group_is_used(
    tmp_path: Path,
) -> None:
    check_key_folder(_key_folder_under(tmp_path, 0o775))


def test_a_key_folder_under_a_folder_writable_by_all_is_refused(tmp_path: Path) -> None:
    keys = _key_folder_under(tmp_path, 0o777)
    with pytest.raises(KeyFileRefusedError, match=r"writable by other users \(mode 0777\)"):
        check_key_folder(keys)


def _databases(monkeypatch: pytest.MonkeyPatch, members: list[str], primary_of: list[int]) -> None:
    """The group of this process holds ``members``; ``primary_of`` users have it as their
    primary group (besides none)."""
    me = os.geteuid()
    monkeypatch.setattr(lockfile.grp, "getgrgid", lambda gid: SimpleNamespace(gr_mem=members))
    monkeypatch.setattr(lockfile.pwd, "getpwuid", lambda uid: SimpleNamespace(pw_name=f"user{uid}"))
    monkeypatch.setattr(
        lockfile.pwd,
        "getpwall",
        lambda: [SimpleNamespace(pw_uid=uid, pw_gid=os.getegid()) for uid in [me, *primary_of]],
    )


def test_a_group_with_another_member_is_not_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = _key_folder_under(tmp_path, 0o775)
    _databases(monkeypatch, members=["mallory"], primary_of=[])
    with pytest.raises(KeyFileRefusedError, match=r"mode 0775"):
        check_key_folder(keys)


def test_another_users_primary_group_is_not_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = _key_folder_under(tmp_path, 0o775)
    _databases(monkeypatch, members=[], primary_of=[54321])
    with pytest.raises(KeyFileRefusedError, match=r"mode 0775"):
        check_key_folder(keys)


def test_a_group_the_databases_do_not_know_is_not_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = _key_folder_under(tmp_path, 0o775)

    def unknown(gid: int) -> None:
        raise KeyError(gid)

    monkeypatch.setattr(lockfile.grp, "getgrgid", unknown)
    with pytest.raises(KeyFileRefusedError, match=r"mode 0775"):
        check_key_folder(keys)
