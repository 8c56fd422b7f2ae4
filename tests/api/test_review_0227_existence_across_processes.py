"""Subject existence across processes (0227-leftovers-of-0218-to-0223, bug UT: a subject
exists once its stream holds events, remembered per process once seen).

A live server (process A) answers for a name; ``uprof consent grant`` and ``uprof erase
subject``, each a process of its own (B), make and erase the subject; A must follow
each step on every road (capture, slice, consents, the subjects listing), its memory of
written streams notwithstanding, and a grant under the erased name is refused as every
road after it is (410). SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.conftest import PLANNER, PRIVACY, LiveServer, bearer, interaction
from tests.children import run_python
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.settings import Settings

_CLI = "import sys\nfrom uprof.cli.main import app\napp(sys.argv[1:])"
NAME = "ulla"


def _cli(settings: Settings, *args: str) -> None:
    cli = ["--data-dir", str(settings.data_dir), "--embedder", "hashing"]
    if settings.database_url:
        cli += ["--database-url", settings.database_url]
    done = run_python(_CLI, *cli, *args)
    assert done.returncode == 0, (done.stdout + done.stderr)[-800:]


def _roads(http: httpx.Client, planner: str, operator: str) -> dict[str, Any]:
    captured = http.post(
        "/v1/captures",
        headers=bearer(planner),
        json={"subject": NAME, **interaction("I live in Oslo")},
    )
    sliced = http.post(
        "/v1/slices",
        headers=bearer(planner),
        json={
            "subject": NAME,
            "query": "where do I live?",
            "budget_tokens": 256,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    )
    consents = http.post("/v1/consents/list", headers=bearer(planner), json={"subject": NAME})
    listed = http.post("/v1/subjects/list", headers=bearer(operator), json={})
    assert listed.status_code == 200, listed.text
    return {
        "capture": captured.status_code,
        "slice": sliced.status_code,
        "consents": consents.status_code,
        "listed": len(listed.json()["items"]),
    }


def test_held_a_subject_made_and_erased_by_another_process_is_followed_on_every_road(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, settings: Settings
) -> None:
    planner = keys.create(PLANNER).token
    privacy = keys.create(PRIVACY).token
    operator = keys.create(PLANNER, ["app", "operator"]).token
    with httpx.Client(base_url=server.url, timeout=60) as http:
        before = _roads(http, planner, operator)
        assert before == {"capture": 403, "slice": 404, "consents": 404, "listed": 0}, before

        _cli(
            settings,
            "consent",
            "grant",
            "--subject",
            NAME,
            "--app",
            PLANNER,
            "--category",
            "*",
            "--purpose",
            "personalization",
            "--collected-by",
            "form:1",
        )
        made = _roads(http, planner, operator)
        assert made == {"capture": 201, "slice": 200, "consents": 200, "listed": 1}, made

        _cli(settings, "erase", "subject", "--subject", NAME)
        erased = _roads(http, planner, operator)
        assert erased["capture"] != 201 and erased["slice"] != 200, erased
        assert erased["consents"] != 200 and erased["listed"] == 0, erased
        exists = http.post(
            "/v1/governance/exports", headers=bearer(privacy), json={"subject": NAME}
        )
        assert exists.status_code != 200, exists.text

        again = http.post(
            "/v1/consents",
            headers=bearer(planner),
            json={
                "subject": NAME,
                "categories": ["*"],
                "purposes": ["personalization"],
                "collected_by": "consent-ui:test",
            },
        )
        after = _roads(http, planner, operator)
    # An erased name stays erased in every process: the grant is refused (410, the
    # erasure ledger), and no road finds a subject under it.
    assert again.status_code == 410, again.text
    assert after == {"capture": 410, "slice": 410, "consents": 410, "listed": 0}, after
