"""Web sessions are signed cookies: they survive a server restart, and a forged one is
refused (on SQLite and on PostgreSQL, with real uvicorn servers one after the other)."""

from __future__ import annotations

import base64
import json
import zlib

import httpx

from tests.api.conftest import LiveServer, bearer, build_kernel, grant
from tests.web.conftest import console_cookie, csrf_of, open_link, privacy_link
from uprof.api import ApiKeyStore
from uprof.server import create_server
from uprof.settings import Settings
from uprof.web.pages import OPERATOR_COOKIE, USER_COOKIE


def _cookie(name: str, value: str) -> dict[str, str]:
    return {"Cookie": f"{name}={value}"}


def _tampered(value: str) -> str:
    """The same cookie with one character in the middle of its signature changed (the
    last base64 character may carry only padding bits, which decode to the same bytes)."""
    body, signature = value.rsplit(".", 1)
    middle = len(signature) // 2
    swapped = "A" if signature[middle] != "A" else "B"
    return f"{body}.{signature[:middle]}{swapped}{signature[middle + 1 :]}"


def _other_subject(value: str) -> str:
    """The cookie's payload rewritten to name another subject, its signature kept."""
    payload, stamp, signature = value.lstrip(".").split(".")
    fields = json.loads(zlib.decompress(base64.urlsafe_b64decode(payload + "==")))
    fields["subject"] = "bob"
    forged = base64.urlsafe_b64encode(zlib.compress(json.dumps(fields).encode())).rstrip(b"=")
    return f".{forged.decode()}.{stamp}.{signature}"


def test_sessions_survive_a_restart_and_forged_cookies_are_refused(settings: Settings) -> None:
    keys = ApiKeyStore.open(settings)
    planner = keys.create("app:planner").token
    operator = keys.create("app:planner", ["app", "operator"]).token
    first = build_kernel(settings)
    try:
        with LiveServer(create_server(first, keys)) as server:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                consent_id = grant(http, planner, subject="alice")
                link = privacy_link(http, operator, "alice")
                user = open_link(http, link).cookies[USER_COOKIE]
                console = console_cookie(http, operator)
    finally:
        first.close()

    second = build_kernel(settings)  # a new process's kernel: same key folder, fresh memory
    try:
        with LiveServer(create_server(second, keys)) as server:
            with httpx.Client(base_url=server.url, timeout=30) as fresh:
                home = fresh.get("/privacy", headers=_cookie(USER_COOKIE, user))
                assert home.status_code == 200, home.text
                assert consent_id in home.text  # alice's privacy center
                assert (
                    fresh.get("/console", headers=_cookie(OPERATOR_COOKIE, console)).status_code
                    == 200
                )

                # A forged or altered cookie is no session.
                assert (
                    fresh.get("/privacy", headers=_cookie(USER_COOKIE, _tampered(user))).status_code
                    == 401
                )
                assert (
                    fresh.get("/privacy", headers=_cookie(USER_COOKIE, "x" * 40)).status_code == 401
                )
                bob = fresh.get("/privacy", headers=_cookie(USER_COOKIE, _other_subject(user)))
                assert bob.status_code == 401
                refused = fresh.get(
                    "/console", headers=_cookie(OPERATOR_COOKIE, _tampered(console))
                )
                assert refused.status_code == 303  # to the console's sign-in
                # A console cookie is not a privacy-center session, nor the other way round.
                assert (
                    fresh.get("/privacy", headers=_cookie(USER_COOKIE, console)).status_code == 401
                )
                wrong_kind = fresh.get("/console", headers=_cookie(OPERATOR_COOKIE, user))
                assert wrong_kind.status_code == 303

                # CSRF is still checked after the restart: the token is the session's own.
                csrf = csrf_of(home.text)
                no_token = fresh.post(
                    "/privacy/logout", data={"csrf": "x" * 32}, headers=_cookie(USER_COOKIE, user)
                )
                assert no_token.status_code == 403
                out = fresh.post(
                    "/privacy/logout", data={"csrf": csrf}, headers=_cookie(USER_COOKIE, user)
                )
                assert out.status_code == 200
                # Signed out: the same cookie is refused by this server.
                assert fresh.get("/privacy", headers=_cookie(USER_COOKIE, user)).status_code == 401

                # A revoked operator key ends its console session, restart or not.
                key_id = next(k.key_id for k in keys.list("app:planner") if "operator" in k.roles)
                keys.revoke(key_id)
                after = fresh.get("/console", headers=_cookie(OPERATOR_COOKIE, console))
                assert after.status_code == 403
    finally:
        second.close()
        keys.close()


def test_a_signed_out_session_is_refused_by_every_server_and_after_a_restart(
    settings: Settings,
) -> None:
    """Sign-outs were kept in the memory of the server that did them: a copy of the
    signed-out cookie (a shared computer, a stolen cookie) still opened the privacy center
    on the deployment's other servers, and on that one after a restart, for the rest of
    the cookie's hour."""
    keys = ApiKeyStore.open(settings)
    planner = keys.create("app:planner").token
    operator = keys.create("app:planner", ["app", "operator"]).token
    first, second = build_kernel(settings), build_kernel(settings)  # two servers
    try:
        with (
            LiveServer(create_server(first, keys)) as a,
            LiveServer(create_server(second, keys)) as b,
            httpx.Client(base_url=a.url, timeout=30) as on_a,
            httpx.Client(base_url=b.url, timeout=30) as on_b,
        ):
            grant(on_a, planner, subject="alice")
            link = on_a.post(
                "/v1/privacy/links", headers=bearer(operator), json={"subject": "alice"}
            ).json()["login_path"]
            user = open_link(on_a, link).cookies[USER_COOKIE]
            home = on_b.get("/privacy", headers=_cookie(USER_COOKIE, user))
            assert home.status_code == 200, home.text  # one deployment: B takes A's cookie
            out = on_a.post(
                "/privacy/logout",
                data={"csrf": csrf_of(home.text)},
                headers=_cookie(USER_COOKIE, user),
            )
            assert out.status_code == 200
            assert on_a.get("/privacy", headers=_cookie(USER_COOKIE, user)).status_code == 401
            assert on_b.get("/privacy", headers=_cookie(USER_COOKIE, user)).status_code == 401
    finally:
        first.close()
        second.close()
    third = build_kernel(settings)  # a restart: fresh memory
    try:
        with (
            LiveServer(create_server(third, keys)) as c,
            httpx.Client(base_url=c.url, timeout=30) as on_c,
        ):
            assert on_c.get("/privacy", headers=_cookie(USER_COOKIE, user)).status_code == 401
    finally:
        third.close()
        keys.close()
