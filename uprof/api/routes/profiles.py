"""The full profile and the evidence behind an item (operator keys only)."""

from __future__ import annotations

from uprof.api.deps import Scope
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import Evidence, EvidenceIn, MemoryListIn, MemoryPage, Profile, ProfileIn

router = api_router(prefix="/v1", tags=["profile"])


@router.post("/profile/read", response_model=Profile, responses=errors(403, 404, 410, 503))
def read_profile(body: ProfileIn, scope: Scope) -> Profile:
    """Read a subject's whole profile (now, or as it stood at ``as_of``).

    Ungated by policy, so it needs a key with the ``operator`` role; apps read
    through ``/v1/slices``.
    """
    return scope.profile(body)


@router.post("/evidence/read", response_model=Evidence, responses=errors(403, 404, 410, 503))
def read_evidence(body: EvidenceIn, scope: Scope) -> Evidence:
    """Show the captured events behind one item (``operator`` role)."""
    return scope.evidence(body)


@router.post("/memories/list", response_model=MemoryPage, responses=errors(403, 404, 410, 503))
def list_memories(body: MemoryListIn, scope: Scope) -> MemoryPage:
    """A subject's memories, oldest first, a page at a time (``operator`` role).

    The profile read returns every layer at once; a long history of memories is read here,
    following ``next_cursor`` until it is null.
    """
    return scope.list_memories(body)
