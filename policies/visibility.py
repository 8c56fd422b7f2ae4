"""Visibility of kernel-managed shared memory between agents (invariant I4).

A private item is visible only to its owner agent; a missing or malformed sharing policy is
private. The rule itself lives in ``domain.values.SharingPolicy``; this module is the one
place the read side asks it, and it refuses nameless agents, which the domain does not.
"""

from __future__ import annotations

from domain.values import SharingPolicy


def is_visible(
    item_owner_agent: str, sharing_raw: str | None, reader_agent: str, reader_agent_type: str
) -> bool:
    """Return whether reader_agent (of reader_agent_type) may see an item of item_owner_agent.

    An empty reader id never sees anything: otherwise a reader with no id would count as the
    owner of every item that lost its owner id, and see it even when private.
    """
    if not reader_agent:
        return False
    policy = SharingPolicy.parse(sharing_raw)
    return policy.allows(
        owner_agent=item_owner_agent,
        reader_agent=reader_agent,
        reader_agent_type=reader_agent_type,
    )
