"""Who may choose the key folder: every link on the way to it, and every folder above it
(review of decisions 0199 and 0201, bugs QC and QD).

Bug QC: 0201 followed a configured link when the link itself was this user's (or its
folder's owner's), but a chain was followed whole with only the first link's owner
checked, and a link among the folders above the configured path not at all: a hop
owned by another user let that user point this deployment at another of this user's key
folders, which passes every check. Every link met is now held to the first one's rule
(or root's, the system's own).

Bug QD: the key folder itself was checked (owned so, not writable by others), the
folders above it not. A key folder in a folder another user may write (without the
sticky bit) was moved away under a running process and replaced by a link to that
user's folder: the process read that user's master secret and wrote its next KEK ring
there (it opens the key files by path, the folder's name included). Files only:
PostgreSQL keeps the same key folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from audit.lockfile import KeyFileRefusedError
from tests.conftest import Backend
from tests.kernel.test_key_folder_link import _lag, _linked_key_folder
from tests.kernel.test_lock_turns_review import sqlite_store  # noqa: F401 (a fixture)
from uprof.bootstrap import build_key_material
from uprof.settings import Settings

OTHER_USER = 4242


def _key_folder(at: Path, secret: bytes, owner: int | None = None) -> Path:
    """A key folder at ``at`` holding a master secret, owned by ``owner`` (default: us)."""
    at.mkdir(mode=0o700, parents=True)
    (at / "master.key").write_bytes(secret * 8)
    (at / "master.key").chmod(0o600)
    if owner is not None:
        for made in (at, at / "master.key"):
            os.chown(made, owner, owner)
    return at


def _settings(tmp_path: Path, key_dir: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", key_dir=key_dir, embedder="hashing")


def test_qc_a_chain_through_another_users_link_is_refused(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """Bug QC, a real CLI process: the configured link (ours) names a link another user
    owns, in that user's folder; whatever it names, they chose. Exit 2 naming the hop.
    main at f9d71eac: followed whole (exit 0), the hop's owner never looked at."""
    env, link, target = _linked_key_folder(sqlite_store, tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_USER, OTHER_USER)
    hop = theirs / "hop"
    hop.symlink_to(target)
    os.lchown(hop, OTHER_USER, OTHER_USER)
    link.unlink()
    link.symlink_to(hop)
    code, said = _lag(env)
    assert code == 2, said
    assert f"reachedthroughthesymboliclink{hop},ownedbyuid{OTHER_USER}" in said, said


def test_qc_another_users_hop_could_point_at_another_deployments_keys(tmp_path: Path) -> None:
    """Bug QC, what the hop gives its owner: another key folder of ours (another
    deployment's, passing every check). main at f9d71eac: the settings resolved to it."""
    _key_folder(tmp_path / "ours", b"ours")
    victim = _key_folder(tmp_path / "other-deployment", b"them")
    hop = tmp_path / "hop"
    hop.symlink_to(victim)
    os.lchown(hop, OTHER_USER, OTHER_USER)
    link = tmp_path / "keys"
    link.symlink_to(hop)
    with pytest.raises(ValidationError, match=f"through the symbolic link {hop}, owned by uid"):
        _settings(tmp_path, link)


def test_qc_a_link_above_the_configured_folder_is_held_to_the_same_rule(tmp_path: Path) -> None:
    """Bug QC: a link among the folders above the configured path chooses as much as the
    configured one. main at f9d71eac: not looked at (``Path.resolve``)."""
    _key_folder(tmp_path / "real" / "keys", b"ours")
    up = tmp_path / "up"
    up.symlink_to(tmp_path / "real")
    os.lchown(up, OTHER_USER, OTHER_USER)
    with pytest.raises(ValidationError, match=f"through the symbolic link {up}, owned by uid"):
        _settings(tmp_path, up / "keys")


def test_held_a_chain_of_our_own_relative_links_is_followed_to_its_end(tmp_path: Path) -> None:
    """Held: relative links, each ours, are followed from where each one is, and the
    settings keep the real folder."""
    real = _key_folder(tmp_path / "volume" / "keys", b"ours")
    (tmp_path / "hops").mkdir()
    (tmp_path / "hops" / "one").symlink_to(Path("..") / "volume" / "keys")
    link = tmp_path / "keys"
    link.symlink_to(Path("hops") / "one")
    settings = _settings(tmp_path, link)
    assert settings.key_dir == real
    assert build_key_material(settings).master_secret() == b"ours" * 8


@pytest.mark.parametrize("end", ["nothing", "loop"])
def test_held_a_chain_to_nothing_or_round_is_refused_and_nothing_is_made(
    tmp_path: Path, end: str
) -> None:
    """Held: a chain whose last hop names nothing (a volume not mounted), or that comes
    back to itself, is refused at start; nothing is created."""
    link, hop = tmp_path / "keys", tmp_path / "hop"
    link.symlink_to(hop)
    hop.symlink_to(tmp_path / "volume" / "keys" if end == "nothing" else link)
    with pytest.raises(ValidationError, match="refused the key folder"):
        _settings(tmp_path, link)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hop", "keys"]


@pytest.mark.parametrize("above", ["writable-by-others", "another-users"])
def test_qd_a_key_folder_another_user_could_replace_is_refused(tmp_path: Path, above: str) -> None:
    """Bug QD: the folder above the key folder writable by others (or theirs). main at
    f9d71eac: the store opened; moved away and replaced by a link to the other user's
    folder under it, its master secret was theirs and its new KEK ring went to them."""
    parent = tmp_path / "shared"
    parent.mkdir()
    keys = _key_folder(parent / "keys", b"ours")
    if above == "writable-by-others":
        parent.chmod(0o777)
        why = "writable by other users (mode 0777)"
    else:
        os.chown(parent, OTHER_USER, OTHER_USER)
        why = f"owned by uid {OTHER_USER}"
    settings = _settings(tmp_path, keys)
    with pytest.raises(KeyFileRefusedError, match=re.escape(f"it is under {parent}, {why}")):
        material = build_key_material(settings)
        # What the other user can do then, while the process runs (main only gets here).
        theirs = _key_folder(tmp_path / "theirs", b"evil", owner=OTHER_USER)
        keys.rename(parent / "ours")
        keys.symlink_to(theirs)
        assert material.master_secret() == b"ours" * 8, "read the other user's secret"


def test_qd_a_linked_key_folder_in_a_folder_others_may_write_is_refused(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """Bug QD, a real CLI process: the link's target is the deployment's own key folder,
    but in a folder others may write. main at f9d71eac: exit 0."""
    env, _, target = _linked_key_folder(sqlite_store, tmp_path)
    target.parent.chmod(0o777)
    code, said = _lag(env)
    assert code == 1, said
    assert f"itisunder{target.parent},writablebyotherusers(mode0777)" in said, said


def test_held_a_key_folder_under_a_sticky_folder_is_used(tmp_path: Path) -> None:
    """Held: a folder others may write but with the sticky bit (``/tmp``'s mode 1777)
    keeps them from renaming what is not theirs: the key folder in it is used."""
    parent = tmp_path / "tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    keys = _key_folder(parent / "keys", b"ours")
    assert build_key_material(_settings(tmp_path, keys)).master_secret() == b"ours" * 8
