"""Every operation's request body has an example in OpenAPI, and the examples work.

An example a user copies from /docs must be accepted as it stands: each one without a
placeholder (``<id from ...>``) is posted to the live server and must not be refused as
invalid; the rest must at least validate against the request schema.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, bearer
from uprof.api import ApiKeyStore

#: Grants come first so the later examples (capture, slice) have the consent they need.
FIRST = ("/v1/consents",)


def _body_schema(spec: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any] | None:
    body = operation.get("requestBody")
    if body is None:
        return None
    ref = body["content"]["application/json"]["schema"]["$ref"]
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]]  # type: ignore[no-any-return]


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = [
        (path, method, op) for path, ops in spec["paths"].items() for method, op in ops.items()
    ]
    return sorted(found, key=lambda f: (f[0] not in FIRST, f[0]))


def _has_placeholder(value: Any) -> bool:
    return "<" in repr(value)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_every_request_body_has_an_example_that_the_server_accepts(
    http: httpx.Client, apps: Apps, keys: ApiKeyStore
) -> None:
    keys.create("app:coach")  # the app the policy examples onboard
    spec = http.get("/openapi.json").json()
    headers = bearer(apps.planner_operator)
    missing, refused, posted = [], [], []
    for path, method, operation in _operations(spec):
        schema = _body_schema(spec, operation)
        if schema is None:
            continue
        examples = schema.get("examples") or []
        if not examples:
            missing.append(path)
            continue
        if _has_placeholder(examples[0]):
            continue
        response = http.request(method.upper(), path, headers=headers, json=examples[0])
        posted.append(path)
        if response.status_code in (400, 422) or response.status_code >= 500:
            refused.append((path, response.status_code, response.text[:300]))
    assert missing == []
    assert refused == []
    # The check ran: the write and read paths were exercised with their examples.
    assert {"/v1/consents", "/v1/captures", "/v1/slices"} <= set(posted)


def _filled(value: Any) -> Any:
    """The example with each ``<placeholder>`` replaced by an id-shaped string."""
    if isinstance(value, dict):
        return {k: _filled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v) for v in value]
    if isinstance(value, str) and value.startswith("<"):
        return "id-0001"
    return value


def test_placeholder_examples_validate_once_the_ids_are_filled_in() -> None:
    from pydantic import BaseModel

    from uprof.schemas import api, policy

    models = [
        m
        for n in dir(api)
        if n.endswith("In") and isinstance(m := getattr(api, n), type) and issubclass(m, BaseModel)
    ]
    models += [policy.PolicyChangeIn, policy.OnboardIn]
    checked = 0
    for model in models:
        extra = model.model_config.get("json_schema_extra") or {}
        for example in extra.get("examples", []):  # type: ignore[union-attr]
            model.model_validate(_filled(example))
            checked += 1
    assert checked >= 19
