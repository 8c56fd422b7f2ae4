"""The data folder's rule (0214-store-damage-in-servers, SK) against the roads an operator
takes and the ones a hostile user does (0216-review-of-0211-to-0214, TC, TD): a data
folder configured as a link of this user's is used, its target held to the rule; a link
on the way owned by another user is refused, as the key folder's
(0201-review-of-0198-0200's QC). Real ``uprof`` processes on SQLite; the folders above
made with other owners need root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit.lockfile import check_data_folder
from uprof.settings import Settings

_ROOT = os.geteuid() == 0
#: A user and group no one here is: the hostile party the folders above are given to.
_STRANGER = 54321


def _cli(
    data_dir: Path | str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {"HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing", "COLUMNS": "400"}
    command = [sys.executable, "-m", "uprof.cli.main", "--data-dir", str(data_dir), *args]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False, cwd=cwd
    )


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + done.stderr).split())


def test_tc_a_data_folder_configured_as_this_users_link_is_used(tmp_path: Path) -> None:
    """Bug TC: a data folder given as a symbolic link of this user's (an operator pointing
    it at a mounted volume) was refused at every start since SK ("a symbolic link"): the
    rule looked at the link, not the folder it names. The key folder's rule follows such
    a link once, at start, and checks its target (PY); the data folder now too."""
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o700)
    link = tmp_path / "data"
    link.symlink_to(volume)
    done = _cli(link, "--key-dir", str(tmp_path / "keys"), "init")
    assert done.returncode == 0, _said(done)
    assert (volume / "events.sqlite").exists()  # the stores are in the link's target


def test_tc_the_data_folder_is_the_links_target_resolved_once(tmp_path: Path) -> None:
    """Every store then opens under the resolved folder: the link swapped while the
    process runs redirects none of them (as the key folder's, PY)."""
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o700)
    link = tmp_path / "data"
    link.symlink_to(volume)
    settings = Settings(data_dir=link, key_dir=tmp_path / "keys")
    assert settings.data_dir == volume


def test_tc_a_link_to_a_folder_open_to_all_is_still_refused(tmp_path: Path) -> None:
    """Following the link does not lose the rule: its target is checked."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "volume").mkdir(mode=0o700)
    link = tmp_path / "data"
    link.symlink_to(shared / "volume")
    done = _cli(link, "--key-dir", str(tmp_path / "keys"), "init")
    said = _said(done)
    assert done.returncode == 1, said
    assert f"refused the data folder {shared / 'volume'}" in said
    assert "writable by other users" in said and "Traceback" not in said
    assert not (shared / "volume" / "events.sqlite").exists()


@pytest.mark.skipif(not _ROOT, reason="giving a link to another user needs root")
def test_td_a_link_on_the_way_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """Bug TD: a link among the folders above the data folder, owned by another user, was
    followed without a look (the rule stats the folders above through links): that user
    re-points it and the deployment's next connections open their stores. The key folder
    refuses such a link (QC); the data folder now too, before any store is made."""
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True, mode=0o700)
    hop = tmp_path / "hop"
    hop.symlink_to(mine)
    os.lchown(hop, _STRANGER, _STRANGER)
    done = _cli(hop / "data", "--key-dir", str(tmp_path / "keys"), "init")
    said = _said(done)
    assert done.returncode != 0, said
    assert f"refused the data folder {hop / 'data'}" in said, said
    assert f"owned by uid {_STRANGER}" in said and "Traceback" not in said
    assert not (mine / "data" / "events.sqlite").exists()


# ------------------------------------------------------------------ held


def test_held_a_relative_data_folder_is_used(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    done = _cli("rel-data", "--key-dir", str(tmp_path / "keys"), "init", cwd=tmp_path)
    assert done.returncode == 0, _said(done)
    assert (tmp_path / "rel-data" / "events.sqlite").exists()


def test_held_a_data_folder_under_tmps_sticky_folder_is_used(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    data = sticky / "data"
    done = _cli(data, "--key-dir", str(tmp_path / "keys"), "init")
    assert done.returncode == 0, _said(done)


@pytest.mark.skipif(not _ROOT, reason="a folder of root's needs root")
def test_held_a_data_folder_under_a_root_owned_0755_folder_is_used(tmp_path: Path) -> None:
    lib = tmp_path / "var-lib"
    lib.mkdir(mode=0o755)
    os.chown(lib, 0, 0)
    check_data_folder(_made(lib / "uprof"))


@pytest.mark.skipif(not _ROOT, reason="a folder of another user's needs root")
def test_held_a_folder_above_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, _STRANGER, _STRANGER)
    done = _cli(theirs / "data", "--key-dir", str(tmp_path / "keys"), "init")
    said = _said(done)
    assert done.returncode == 1, said
    assert f"owned by uid {_STRANGER}, who could replace it" in said


@pytest.mark.skipif(not _ROOT, reason="a folder of another group's needs root")
def test_held_a_folder_above_writable_by_another_group_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "group-shared"
    shared.mkdir()
    os.chown(shared, os.geteuid(), _STRANGER)  # a group the databases do not know
    shared.chmod(0o2775)
    done = _cli(shared / "data", "--key-dir", str(tmp_path / "keys"), "init")
    said = _said(done)
    assert done.returncode == 1, said
    assert "writable by other users (mode 2775)" in said


def test_held_postgresql_does_not_check_the_data_folder(tmp_path: Path) -> None:
    """PostgreSQL's stores are not in the data folder: a folder open to all there does
    not stop the start's settings (the layout names no file in it)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    settings = Settings(
        data_dir=shared / "data",
        key_dir=tmp_path / "keys",
        database_url="postgresql+psycopg://postgres@127.0.0.1:5432/uprof_never_opened",
    )
    from uprof.storage import layout_for

    layout = layout_for(settings)
    assert "postgresql" in layout.events_url


def _made(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    return folder
