"""``POST /v1/audit/verify`` and the line cap (KX) and fixed csv field limit (KY), with the
server running in this process (so the csv module's global limit is observable)."""

from __future__ import annotations

import csv
import threading

import httpx

from audit import export_format
from audit.export_format import CSV_COLUMNS, csv_line
from tests.api.conftest import PLANNER, LiveServer, bearer
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server


def _cap() -> int:
    """The cap KX adds (4 MiB), read so that these tests also run, and fail, before it."""
    return int(getattr(export_format, "MAX_LINE_BYTES", 4 * 1024 * 1024))


def test_two_uploads_verified_at_once_leave_the_csv_limit_where_it_was(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """KY: two threads of one server verify CSV uploads with long lines at the same time;
    each is refused for what its row holds (never "field larger than field limit"), and
    the process-wide limit is the same afterwards (IY raised it to each upload's line)."""
    operator = keys.create(PLANNER, ["app", "operator"]).token
    before = csv.field_size_limit()
    contents = [
        csv_line(CSV_COLUMNS) + "entry," + "x" * (size * 1024) + "\n" for size in (600, 900)
    ]
    answers: list[httpx.Response] = []
    start = threading.Barrier(len(contents))

    def upload(content: str) -> None:
        with httpx.Client(base_url=live.url, timeout=120) as http:
            start.wait()
            answers.append(
                http.post(
                    "/v1/audit/verify",
                    headers=bearer(operator),
                    json={"kind": "export", "content": content},
                )
            )

    with LiveServer(create_server(kernel, keys)) as live:
        threads = [threading.Thread(target=upload, args=(c,)) for c in contents]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    for answer in answers:
        body = answer.json()
        assert body["ok"] is False and body["line_number"] == 2
        assert "field larger than field limit" not in body["detail"]
    assert csv.field_size_limit() == before == _cap()


def test_an_upload_line_over_the_cap_is_refused_naming_it_when_the_body_fits(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """KX on the server: with the body limit raised above the cap (``--max-body-bytes``),
    a line over the cap is refused with its number and the cap; under the default body
    limit (1 MiB, below the cap) the body is refused first (413, tested in
    tests/api/test_review_of_0151.py)."""
    operator = keys.create(PLANNER, ["app", "operator"]).token
    content = "{" + "x" * _cap() + "\n"
    app = create_server(kernel, keys, max_body_bytes=2 * _cap())
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=120) as http:
        answer = http.post(
            "/v1/audit/verify",
            headers=bearer(operator),
            json={"kind": "export", "content": content},
        )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["ok"] is False, body
    assert body["line_number"] == 1 and f"longer than {_cap()} bytes" in body["detail"]
