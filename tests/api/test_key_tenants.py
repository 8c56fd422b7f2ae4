"""An API key belongs to the tenant it was issued in.

Found in a hostile-caller review (2026-12-05): a deployment's tenant is a setting
(``UPROF_TENANT``) and the stores keep tenants apart (subject index, policy, audit), but the
``api_keys`` table named no tenant: a key issued in one tenant authenticated on a server of
another tenant over the same stores as the app of the same name there (``/v1/whoami``
answered 200 with the key's app on the code before the fix, and every request was decided
by the other tenant's policy for that app), and that tenant's operators listed and revoked
it. A key now carries its tenant; elsewhere it is unknown (401).
"""

from __future__ import annotations

import httpx

from tests.api.conftest import PLANNER, LiveServer, bearer
from uprof.api import ApiKeyStore
from uprof.apikeys.tables import api_keys
from uprof.kernel import Uprof
from uprof.server import create_server


def test_a_key_of_another_tenant_is_unknown(
    keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore]
) -> None:
    other_kernel, other_keys = other
    mine = keys.create(PLANNER)
    theirs = other_keys.create(PLANNER)
    with (
        LiveServer(create_server(other_kernel, other_keys)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        foreign = http.get("/v1/whoami", headers=bearer(mine.token))
        own = http.get("/v1/whoami", headers=bearer(theirs.token))
    assert foreign.status_code == 401, foreign.text
    assert own.status_code == 200 and own.json()["key_id"] == theirs.info.key_id
    # Each tenant's operators see and revoke their own keys only.
    assert [k.key_id for k in other_keys.list()] == [theirs.info.key_id]
    assert not other_keys.revoke(mine.info.key_id)
    assert keys.authenticate(mine.token) is not None
    assert other_keys.authenticate(mine.token) is None


def test_a_key_issued_before_keys_named_their_tenant_still_opens_the_stores(
    keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore]
) -> None:
    """Keys issued before the ``tenant`` column have none: they keep working as they did
    (in any tenant) until replaced; docs/security.md says how to replace them."""
    _, other_keys = other
    legacy = keys.create(PLANNER)
    with keys._engine.begin() as conn:  # as the migration leaves a key issued before it
        conn.execute(
            api_keys.update().where(api_keys.c.key_id == legacy.info.key_id).values(tenant=None)
        )
    assert keys.authenticate(legacy.token) is not None
    assert other_keys.authenticate(legacy.token) is not None
