"""The console's verify upload runs off the server's event loop.

Checking an uploaded export is CPU work (hashes and signatures over up to
``MAX_UPLOAD_BYTES``) and reads the stores; done inside the ``async`` handler it held the
one event loop, so every other request of every caller (captures, slices, health checks)
waited for it. Here the check, once started, is held until another request has been answered: on the
loop, that request can never be answered (it times out); off the loop, it is.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer
from tests.web.conftest import csrf_of
from uprof.web import console_audit


def test_a_verify_upload_being_checked_holds_up_no_other_request(
    server: LiveServer, apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    checking, answered = threading.Event(), threading.Event()
    real_check = console_audit.verify_upload

    def check_after_another_request(*args: Any, **kwargs: Any) -> Any:
        checking.set()
        answered.wait(timeout=30)  # a broken server ends the test, not the suite
        return real_check(*args, **kwargs)

    monkeypatch.setattr(console_audit, "verify_upload", check_after_another_request)
    outcome: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/verify").text)

        def upload() -> None:
            outcome["verify"] = console.post(
                "/console/verify",
                data={"csrf": csrf, "kind": "export"},
                files={"upload": ("trail.jsonl", b"{}\n", "application/x-ndjson")},
            )

        uploading = threading.Thread(target=upload)
        uploading.start()
        try:
            assert checking.wait(timeout=30)  # the upload is being checked now
            with httpx.Client(base_url=server.url, timeout=10) as other:
                health = other.get("/healthz")
            answered.set()
        finally:
            answered.set()
            uploading.join(timeout=60)
    assert health.status_code == 200
    assert outcome["verify"].status_code == 422  # "{}" is no export: checked, and refused
    assert "text/html" in outcome["verify"].headers["content-type"]
