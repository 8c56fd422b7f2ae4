"""Identity registries: sessions and identifiers an app knows a subject by."""

from __future__ import annotations

from uprof.api.deps import CurrentPrincipal, Scope
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import (
    IdentifierIn,
    Registered,
    SessionIn,
    SubjectListIn,
    SubjectPage,
    WhoAmI,
)

router = api_router(prefix="/v1", tags=["identity"])


@router.post(
    "/sessions", status_code=201, response_model=Registered, responses=errors(403, 404, 410, 503)
)
def register_session(body: SessionIn, scope: Scope) -> Registered:
    """Bind a session id of this app to a subject, so slices can name the session."""
    return scope.register_session(body)


@router.post(
    "/identifiers", status_code=201, response_model=Registered, responses=errors(403, 404, 410, 503)
)
def register_identifier(body: IdentifierIn, scope: Scope) -> Registered:
    """Record that an identifier this app knows the user by (an e-mail) names a subject."""
    return scope.register_identifier(body)


@router.get("/whoami", response_model=WhoAmI, responses=errors())
def whoami(principal: CurrentPrincipal) -> WhoAmI:
    """Say which app and roles the presented API key stands for."""
    return WhoAmI(app_id=principal.app_id, key_id=principal.key_id, roles=sorted(principal.roles))


@router.post("/subjects/list", response_model=SubjectPage, responses=errors(403))
def list_subjects(body: SubjectListIn, scope: Scope) -> SubjectPage:
    """Live subjects by their audit pseudonym, oldest first, a page at a time (``operator``).

    References (names, e-mails) are never stored, so they are never listed; a pseudonym
    filters the audit trail (``subject`` in ``/v1/audit/entries``).
    """
    return scope.list_subjects(body)
