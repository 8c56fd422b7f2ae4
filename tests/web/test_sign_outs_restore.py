"""A restore from a backup keeps the deployment's sign-outs (SQLite and PostgreSQL, real
uvicorn servers one after the other, a backup and a restore between them)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from tests.api.conftest import LiveServer, build_kernel, grant
from tests.web.conftest import console_cookie, csrf_of, open_link, privacy_link
from uprof.api import ApiKeyStore
from uprof.server import create_server
from uprof.services.backup import backup, restore
from uprof.settings import Settings
from uprof.storage import RESTORE_MARKER
from uprof.web.pages import OPERATOR_COOKIE, USER_COOKIE


def _cookie(name: str, value: str) -> dict[str, str]:
    return {"Cookie": f"{name}={value}"}


def test_a_restore_does_not_bring_signed_out_sessions_back(
    settings: Settings, tmp_path: Path
) -> None:
    """Sign-outs are rows of the views database, which a restore replaces with the
    backup's: until 2026-12-05 a session signed out after the backup was taken opened
    again after the restore (a copy of its cookie: a shared computer, a stolen cookie),
    for the rest of its hour, in the console and in the privacy center alike."""
    keys = ApiKeyStore.open(settings)
    planner = keys.create("app:planner").token
    operator = keys.create("app:planner", ["app", "operator"]).token
    kernel = build_kernel(settings)
    try:
        with (
            LiveServer(create_server(kernel, keys)) as server,
            httpx.Client(base_url=server.url, timeout=30) as http,
        ):
            grant(http, planner, subject="alice")
            link = privacy_link(http, operator, "alice")
            user = open_link(http, link).cookies[USER_COOKIE]
            console = console_cookie(http, operator)
    finally:
        kernel.close()
    backup(settings, tmp_path / "backup")  # both sessions live at the backup's time

    kernel = build_kernel(settings)
    try:
        with (
            LiveServer(create_server(kernel, keys)) as server,
            httpx.Client(base_url=server.url, timeout=30) as http,
        ):
            home = http.get("/privacy", headers=_cookie(USER_COOKIE, user))
            assert home.status_code == 200, home.text
            out = http.post(
                "/privacy/logout",
                data={"csrf": csrf_of(home.text)},
                headers=_cookie(USER_COOKIE, user),
            )
            assert out.status_code == 200
            page = http.get("/console/policy", headers=_cookie(OPERATOR_COOKIE, console))
            assert page.status_code == 200, page.text
            out = http.post(
                "/console/logout",
                data={"csrf": csrf_of(page.text)},
                headers=_cookie(OPERATOR_COOKIE, console),
                follow_redirects=False,
            )
            assert out.status_code == 303
    finally:
        kernel.close()

    restore(settings, tmp_path / "backup")
    kernel = build_kernel(settings)
    try:
        with (
            LiveServer(create_server(kernel, keys)) as server,
            httpx.Client(base_url=server.url, timeout=30) as http,
        ):
            assert http.get("/privacy", headers=_cookie(USER_COOKIE, user)).status_code == 401
            again = http.get(
                "/console", headers=_cookie(OPERATOR_COOKIE, console), follow_redirects=False
            )
            assert again.status_code == 303  # to the sign-in page: no session
            assert again.headers["location"] == "/console/login"
    finally:
        kernel.close()
        keys.close()


def test_a_restore_run_again_after_a_kill_keeps_the_sign_outs_it_had_read(
    settings: Settings, tmp_path: Path
) -> None:
    """A restore killed after it replaced the views is finished by running it again; the
    live sign-outs it had read are then only in its marker, and are kept from there."""
    build_kernel(settings).close()
    backup(settings, tmp_path / "backup")
    until = datetime.now(UTC) + timedelta(minutes=30)
    marker = settings.data_dir / RESTORE_MARKER
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(  # as a restore killed after it replaced the stores left it
        json.dumps(
            {
                "from": "elsewhere",
                "sign_outs": [["signed-out-before-the-kill", until.isoformat()]],
            }
        ),
        encoding="utf-8",
    )
    restore(settings, tmp_path / "backup")
    assert not marker.exists()
    kernel = build_kernel(settings)
    try:
        assert kernel.web_sign_outs is not None
        assert kernel.web_sign_outs.is_signed_out("signed-out-before-the-kill")
    finally:
        kernel.close()
