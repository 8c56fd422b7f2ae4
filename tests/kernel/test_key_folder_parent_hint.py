"""A key folder refused for the folder above it says how to mend that folder (review
of 0203 and 0205, bug RG).

0203's QD refuses a key folder under a folder other users may write (no sticky bit;
group-writable too unless the group is the user's private group, see
test_key_folder_private_group.py). The refusal named the folder and its mode, but its
hint told the operator to ``chmod 700`` the key folder (already 0700) and said nothing of
the folder above. A real CLI process (a first start on SQLite).
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
    done = _uprof(settings, "policy", "show")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said
    assert f"it is under {deploy}, writable by other users (mode 0777)" in said, said
    assert "chmod go-w" in said and "folders above it" in said, said
    assert not (deploy / "data").exists(), "a store was made beside a refused key folder"
