"""Reads of the key store and key moves leave an audit entry, as administrative writes do.

Decision 0067 put ``uprof apps create`` and ``uprof apps revoke`` on the log; ``uprof apps
list`` (which shows every key's id, app and roles) still read the key store directly,
decided and recorded nothing, and ``uprof keys move-out`` (which moves the master key,
KEKs, signing key and key database out of the data folder) left no trace either (found
2026-12-05). Both now go through the door as the local operator: ``apikey.listed`` (the app
filter, how many keys) and ``keys.moved_out`` (how many files); the trail still verifies.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.api.conftest import api_settings
from tests.conftest import Backend
from tests.kernel.test_admin_audit import CLI_LABEL, cli_for, trail, verifies


def test_listing_api_keys_is_audited(backend: Backend, tmp_path: Path) -> None:
    run = cli_for(backend)
    token = run("apps", "create", "app:x").strip().splitlines()[-1]
    listed = json.loads(run("apps", "list"))
    assert [k["app_id"] for k in listed] == ["app:x"]
    assert json.loads(run("apps", "list", "--app", "app:y")) == []

    entries = [e for e, _ in trail(backend) if e["action"] == "apikey.listed"]

    assert [e.get("app_id") for e in entries] == [None, "app:y"]
    assert [e["counts"] for e in entries] == [{"keys": 1}, {"keys": 0}]
    assert {e["principal"] for e in entries} == {CLI_LABEL}
    assert not any(token.split("_", 2)[2] in text for _, text in trail(backend))
    verifies(run, tmp_path)


def test_moving_key_files_out_of_the_data_folder_is_audited(
    backend: Backend, tmp_path: Path
) -> None:
    run = cli_for(backend)
    run("apps", "create", "app:x")  # the deployment exists, its keys in the key folder
    settings = api_settings(backend, background=False)
    names = ["master.key", "keks.json", "audit-signing.pem", "keys.sqlite"]
    legacy = [n for n in names if (settings.key_path / n).exists()]
    assert legacy
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    for name in legacy:  # as an older uprof kept them
        os.replace(settings.key_path / name, settings.data_dir / name)

    run("keys", "move-out")

    moved = [e for e, _ in trail(backend) if e["action"] == "keys.moved_out"]
    assert len(moved) == 1
    assert moved[0]["counts"] == {"files": len(legacy)}
    assert moved[0]["principal"] == CLI_LABEL
    verifies(run, tmp_path)
