"""What an ``audit.read`` records of a page's subject filter: a pseudonym, never the text.

Found in the attack review of 2026-12-05 (decision 0094): the subject filter of an audit
page was taken as a pseudonym whenever it began with ``subj_``, and since every page is
now recorded, whatever followed ``subj_`` went verbatim into the append-only log as the
read's ``subject_ref`` (a token: ``subj_JohnSmith_1980-01-02`` passes the allowlist's shape
check). The log outlives erasure and must hold no personal text (INVARIANTS I10). The same
rule hid the trail of a subject whose own reference begins with ``subj_``: searching for it
looked for the reference itself, which no entry carries. Both backends.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.kernel import Uprof


def _reads(kernel: Uprof) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_entries(action="audit.read")]


def test_a_subject_filter_that_is_no_pseudonym_leaves_no_text_on_the_log(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    typed = "subj_JohnSmith_born_1980-01-02"
    answer = http.post(
        "/v1/audit/entries",
        headers=bearer(apps.planner_operator),
        json={"subject": typed, "limit": 10},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["items"] == []
    (read,) = _reads(kernel)
    assert "JohnSmith" not in json.dumps(read), read
    assert read["subject_ref"].startswith("subj_")


def test_a_subject_whose_reference_begins_like_a_pseudonym_is_found_by_it(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    grant(http, apps.planner, subject="subj_alice")
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "subj_alice", **interaction("I want to learn the cello")},
    )
    assert ack.status_code == 201, ack.text
    pseudonym = kernel.subjects.pseudonym("subj_alice")

    def listed(subject: str) -> list[int]:
        answer = http.post(
            "/v1/audit/entries",
            headers=bearer(apps.planner_operator),
            json={"subject": subject, "limit": 500},
        )
        assert answer.status_code == 200, answer.text
        return [i["leaf_index"] for i in answer.json()["items"]]

    def own() -> list[int]:
        bound = _reads(kernel)[-1]["tree_size"]
        return [e.leaf_index for e in kernel.audit_entries(subject_ref=pseudonym, tree_size=bound)]

    by_reference = listed("subj_alice")
    assert by_reference, "the subject's trail is found by its reference"
    assert by_reference == own()
    # A pseudonym still stands for itself (the console's subjects list links by it).
    assert listed(pseudonym) == own()
