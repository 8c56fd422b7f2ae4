"""A cursor minted in one tenant is refused in another on the same stores (hostile callers
round 7: held; both backends).

Tenants on shared stores share the cursor key (it is derived from the master secret), an
app id names an app in each tenant, and subject names are the callers' own: the same
``app:planner`` listing the consents of an ``alice`` in two tenants, or an operator
listing subjects in each, reads lists that differ only by tenant. The listing a cursor is
bound to names the principal's tenant (``Facade._listing``), so a next page's cursor of
tenant A sent in tenant B is a 422 naming ``cursor``, and B's own walk is unaffected.
"""

from __future__ import annotations

import pytest

from domain.errors import InvalidInputError
from domain.principal import Principal, PrincipalKind
from tests.api.conftest import PLANNER
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.facade import Facade
from uprof.kernel import Uprof


def _planner(kernel: Uprof) -> Facade:
    tenant = kernel.subjects.tenant
    return Facade(kernel, Principal(tenant, PLANNER, "k1", PrincipalKind.APP, frozenset({"app"})))


def test_held_a_cursor_of_one_tenant_is_refused_in_another(
    kernel: Uprof, other: tuple[Uprof, ApiKeyStore]
) -> None:
    other_kernel, _ = other
    for k in (kernel, other_kernel):
        for purpose in ("personalization", "scheduling", "support"):
            k.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=[purpose])
        for name in ("bob", "carol"):
            k.grant_consent(name, app_id=PLANNER, categories=["*"], purposes=["support"])
    runtimes = [ServiceRuntime.for_kernel(k) for k in (kernel, other_kernel)]
    for runtime in runtimes:
        runtime.start()
    try:
        _walk(kernel, other_kernel)
    finally:
        for runtime in runtimes:
            runtime.stop()


def _walk(kernel: Uprof, other_kernel: Uprof) -> None:
    here, there = _planner(kernel), _planner(other_kernel)
    cursor = here.list_consents("alice", limit=1).next_cursor
    assert cursor is not None
    with pytest.raises(InvalidInputError) as refused:
        there.list_consents("alice", cursor=cursor, limit=1)
    assert refused.value.field == "cursor"
    assert len(there.list_consents("alice", limit=5).items) == 3  # B's own walk

    operators = [
        Facade(k, Principal.local_operator(k.subjects.tenant)) for k in (kernel, other_kernel)
    ]
    listed = operators[0].list_subjects(limit=1).next_cursor
    assert listed is not None
    with pytest.raises(InvalidInputError) as refused_subjects:
        operators[1].list_subjects(cursor=listed, limit=1)
    assert refused_subjects.value.field == "cursor"
