"""What the CLI says, as a person and a script read it (decision 0237-the-wrong-folder):
``uprof audit rotate-key`` in sentences as its neighbours, JSON with ``--json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import children
from tests.conftest import Backend


def _env(backend: Backend) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    env.update(HF_HUB_OFFLINE="1", UPROF_EMBEDDER="hashing")
    env["UPROF_DATA_DIR"] = str(backend.data_dir / "data")
    if backend.kind == "postgres":
        env["UPROF_DATABASE_URL"] = backend.url
    return env


def _cli(backend: Backend, *args: str) -> str:
    done = children.run_python(children.CLI_SCRIPT, *args, env=_env(backend), timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_wn_audit_rotate_key_says_what_it_did_in_words(backend: Backend, tmp_path: Path) -> None:
    """Bug WN. ``uprof audit rotate-key`` printed a JSON object where ``audit export``,
    ``public-key``, ``keys`` and ``checkpoint`` print a sentence; docs/cli.md's convention
    is words, and ``--json`` (``slice``, ``policy show``) for scripts. It says now which
    key signs, which endorsed it and what to do next; ``--json`` gives the old object."""
    said = " ".join(_cli(backend, "audit", "rotate-key").split())
    with pytest.raises(json.JSONDecodeError):
        json.loads(said)
    _cli(backend, "audit", "keys", "--out", str(tmp_path / "keys.json"))
    first, second = json.loads((tmp_path / "keys.json").read_text())["keys"]
    assert said.startswith("audit key rotated (rotation 1):"), said
    assert f"signs with key {second['key_id']}" in said
    assert f"previous key {first['key_id']}" in said
    assert "uprof audit keys" in said

    done = json.loads(_cli(backend, "audit", "rotate-key", "--json"))
    assert done["seq"] == 2
    assert done["previous_key_id"] == second["key_id"]
    assert set(done) == {"seq", "previous_key_id", "key_id", "rotated_at"}


#: Files the system refuses, each named by an option of a command that writes it.
LONG_NAME = "x" * 300


def _refused_files(tmp: Path) -> dict[str, list[str]]:
    folder = tmp / "a-folder"
    folder.mkdir(exist_ok=True)
    return {
        "export into a folder": ["audit", "export", "--out", str(folder)],
        "public key in no folder": ["audit", "public-key", "--out", str(tmp / "no" / "k.pem")],
        "checkpoint name too long": ["audit", "checkpoint", "--out", str(tmp / LONG_NAME)],
        "keys under a file": ["audit", "keys", "--out", "/dev/null/keys.json"],
        "receipt into a folder": ["erase", "subject", "--subject", "alice", "--out", str(folder)],
        "export-subject into a folder": [
            "export-subject",
            "--subject",
            "alice",
            "--out",
            str(folder),
        ],
        "backup to a device": ["backup", "--to", "/dev/null"],
        "restore from a name too long": ["restore", "--from", str(tmp / LONG_NAME)],
        "residue backups too long": [
            "audit",
            "residue",
            "--term",
            "alice",
            "--backups",
            str(tmp / LONG_NAME),
        ],
    }


def test_wo_a_file_the_system_refuses_is_named_as_its_option(
    backend: Backend, tmp_path: Path
) -> None:
    """Bug WO. An ``--out`` that is a folder, in a folder that does not exist or with a name
    too long, ``backup --to`` a device, ``restore --from`` or ``residue --backups`` with a
    name too long: each ended in the OSError's traceback (an erasure's ``--out`` after the
    erasure was done, its receipt lost). Each is bad input now, exit 2, naming the option,
    and an ``--out`` is checked before the command does anything."""
    wrong = {}
    for what, args in _refused_files(tmp_path).items():
        done = children.run_python(children.CLI_SCRIPT, *args, env=_env(backend), timeout=300)
        named = args[-2]  # the option naming the refused path
        if done.returncode != 2 or "Traceback" in done.stderr or named not in done.stderr:
            wrong[what] = (done.returncode, " ".join(done.stderr.split())[-300:])
    assert wrong == {}


def test_wo_keys_move_out_of_a_folder_that_is_not_there(tmp_path: Path) -> None:
    """Bug WO. ``uprof keys move-out`` on a data folder that does not exist made the key
    folder, then ended in ``FileNotFoundError`` (a traceback); it is refused as any command
    of a deployment sent where none is (exit 8), making nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    env.update(UPROF_DATA_DIR=str(tmp_path / "gone"), HF_HUB_OFFLINE="1")
    done = children.run_python(children.CLI_SCRIPT, "keys", "move-out", env=env, timeout=300)
    assert done.returncode == 8, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["option", "setting"])
def test_wp_an_extractor_timeout_past_any_clock_is_refused(how: str, tmp_path: Path) -> None:
    """Bug WP. ``uprof extractor check --timeout-s 1e309`` (or ``UPROF_LLM_TIMEOUT_S``, which
    servers and workers read too) ended in ``OverflowError: timestamp out of range`` as a
    traceback; the timeout is bounded (above 0, at most 3600 s), exit 2 naming it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    env.update(UPROF_DATA_DIR=str(tmp_path / "d"), HF_HUB_OFFLINE="1")
    args = ["extractor", "check", "--base-url", "http://127.0.0.1:9/v1"]
    if how == "option":
        args += ["--timeout-s", "1e309"]
        named = "--timeout-s"
    else:
        env["UPROF_LLM_TIMEOUT_S"] = "1e309"
        named = "UPROF_LLM_TIMEOUT_S"
    done = children.run_python(children.CLI_SCRIPT, *args, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert named in done.stderr
