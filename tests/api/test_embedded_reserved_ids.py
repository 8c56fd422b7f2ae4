"""Embedded code naming one of uprof's own principals (decision 0173's Left): held, by
design. Embedded code holds the kernel and its stores, so it is inside the trust
boundary (docs/security.md, "What these checks do not guarantee"): it could build any
principal past the SDK. ``Client.embedded`` therefore takes the app id it is given,
reserved ones included, and this pins what that name is worth: an app's principal
decided by the policy as an app of that name, never that principal's rights (the
privacy center's subject rights, the operators' rows, the local operator's scan)."""

from __future__ import annotations

import pytest

from domain.principal import OPERATORS, RESERVED_APP_IDS
from tests.api.conftest import PLANNER
from uprof.kernel import Uprof
from uprof.sdk import APIError, Client


@pytest.mark.parametrize("name", sorted(RESERVED_APP_IDS - {OPERATORS}))
def test_embedded_code_naming_a_reserved_principal_gets_only_an_apps_rights(
    kernel: Uprof, name: str
) -> None:
    """Held: ``Client.embedded(kernel, "privacy-center")`` (or ``operator:local``,
    ``system:worker``) is accepted and acts as an app so named: export and erasure of a
    subject, which the privacy center's data subject and the operators may do, are
    refused by the policy and audited under the name, nothing erased.
    (``operators`` itself: ``test_mcp_attacks.test_an_app_named_operators_...``.)"""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    client = Client.embedded(kernel, name)
    try:
        assert client.whoami().app_id == name
        codes = []
        for attempt in (
            lambda: client.export_subject("alice"),
            lambda: client.erase_subject("alice"),
            lambda: client.audit_entries(),
        ):
            with pytest.raises(APIError) as refused:
                attempt()
            codes.append(refused.value.code)
    finally:
        client.close()
    assert codes == ["permission_denied", "permission_denied", "role_required"]
    assert [c.app_id for c in kernel.profile("alice").consents] == [PLANNER]  # not erased
    denied = [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied"]
    assert denied and {e["app_id"] for e in denied} == {name}
    assert all(e["principal"].startswith(f"{name}#") for e in denied)
