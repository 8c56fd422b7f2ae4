"""0209-cli-truths attacked as a hostile local user would, in real CLI processes
(0212-review-of-0208-to-0210): ``--port`` spelled the ways the option reads leniently,
and ways it refuses; a data folder reached through a link into a folder others may write; first
starts racing. All held on main; kept."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import children
from tests.kernel.test_review_0141 import _uprof
from uprof.settings import Settings


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, UPROF_DATA_DIR=str(tmp_path / "data"), UPROF_EMBEDDER="hashing")


#: Spellings of the port ``p`` the option reads as ``p`` (typer reads an int leniently).
READ_AS_THE_PORT = {
    "plus": lambda p: f"+{p}",
    "blanks": lambda p: f" {p} ",
    "underscore": lambda p: f"{p[0]}_{p[1:]}",
    "leading-zeros": lambda p: f"00{p}",
    "integral-decimal": lambda p: f"{p}.0",
}


@pytest.mark.parametrize("spelling", sorted(READ_AS_THE_PORT))
def test_held_a_port_spelled_leniently_is_that_port(tmp_path: Path, spelling: str) -> None:
    """Each spelling names the port it reads as, not another: given a port that is
    taken, the server cannot listen on it, exit 3 "address already in use" (a spelling
    read as another number would listen there, or be refused, exit 2)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        spelled = READ_AS_THE_PORT[spelling](port)
        done = children.run_python(
            children.CLI_SCRIPT, "serve", "--port", spelled, env=_env(tmp_path), timeout=120
        )
    assert done.returncode == 3, done.stderr
    assert "address already in use" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "spelled",
    [
        "0x50",
        "80.5",
        "8e1",
        "",
        "\uff18\uff10",
        "\u0668\u0660\u0660\u0660\u0660",
        "65536.0",
        "True",
    ],
)
def test_held_a_port_that_is_no_whole_number_in_range_is_refused_naming_it(
    tmp_path: Path, spelled: str
) -> None:
    """Hex, a fraction, an exponent, nothing, fullwidth and Arabic-Indic digits, a
    decimal past 65535, a boolean: exit 2 naming ``--port``, nothing served."""
    done = children.run_python(
        children.CLI_SCRIPT, "serve", "--port", spelled, env=_env(tmp_path), timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "'--port'" in done.stderr, done.stderr


def test_held_a_data_folder_linked_into_a_folder_others_may_write_is_refused_leaving_nothing(
    tmp_path: Path,
) -> None:
    """The data folder's path goes through a link (the user's own) into a folder with
    mode 0777: the key folder is checked where the link leads, refused, and the start
    removes what it made there."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "deploy").symlink_to(shared)
    # A first start: `init` (a command that reads, such as `policy show`, makes nothing
    # where no deployment is since 0237-the-wrong-folder, and says so).
    done = _uprof(Settings(data_dir=home / "deploy" / "a" / "data", embedder="hashing"), "init")
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, said
    assert f"under {shared}, writable by other users (mode 0777)" in said, said
    assert sorted(shared.iterdir()) == [], "a refused start left a folder it made"
    assert sorted(p.name for p in home.iterdir()) == ["deploy"]


def test_held_first_starts_racing_all_start_on_one_private_key_folder(tmp_path: Path) -> None:
    """Three first starts at once, the data folder's parents missing: each makes what is
    missing or finds another's (never refused for it), and one 0700 key folder results."""
    deploy = tmp_path / "deploy"
    deploy.mkdir(mode=0o700)
    data = deploy / "a" / "b" / "data"
    code = "import sys; from uprof.cli.main import app; sys.argv[0] = 'uprof'; app()"
    args = ["--data-dir", str(data), "--embedder", "hashing", "init"]  # first starts
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outcomes = [
        (start.wait(timeout=180), start.stderr.read() if start.stderr else "") for start in starts
    ]
    for start in starts:
        for stream in (start.stdout, start.stderr):
            if stream is not None:
                stream.close()
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
    keys = deploy / "a" / "b" / "data.keys"
    assert keys.is_dir() and keys.stat().st_mode & 0o777 == 0o700
