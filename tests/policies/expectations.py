"""The seed policy's intended meaning, written out by hand.

Independent of the enforcer on purpose: it restates seed_policy.csv as plain sets, so a
change to the policy file or the model that changes any decision fails the matrix test.
"""

from __future__ import annotations

#: The catalogue as this table was written against; a test checks it still equals CATEGORIES.
ALL_CATEGORIES = (
    "identity",
    "location",
    "occupation",
    "language",
    "preference",
    "diet",
    "pet",
    "family",
    "schedule",
    "goal",
    "health",
    "contact",
    "conversation",
    "experience",
    "finance",
)
ACTIONS = (
    "read",
    "capture",
    "propose",
    "consent",
    "erase",
    "export",
    "audit",
    "inspect",
    "policy",
    "operate",
)
PURPOSES = (
    "personalization",
    "operations",
    "scheduling",
    "erasure",
    "access-request",
    "compliance",
    "marketing",
    "research",
)
TENANTS = ("default", "acme")
UNKNOWN_APP = "app:unknown"
OPERATORS = "operators"
APPS = (
    "app:planner",
    "app:calendar",
    "app:privacy-console",
    "app:compliance-console",
    OPERATORS,
    UNKNOWN_APP,
)

_ASSISTANT = ("preference", "diet", "language", "conversation", "goal", "schedule", "experience")
_SCHEDULER_READS = ("schedule", "goal", "contact", "location")
_SCHEDULER_WRITES = ("schedule", "goal")
#: What the scheduler may record consent for: what it reads, plus its raw captures.
_SCHEDULER_CONSENTS = (*_SCHEDULER_READS, "conversation")

#: (action, category, purpose) each app may do in tenant "default"; everything else is denied.
ALLOWED_IN_DEFAULT: dict[str, frozenset[tuple[str, str, str]]] = {
    "app:planner": frozenset(
        {
            (action, category, "personalization")
            for action in ("read", "capture", "propose", "consent")
            for category in _ASSISTANT
        }
        # May record where users live (for schedulers), never read it back.
        | {("capture", "location", "personalization"), ("consent", "location", "personalization")}
    ),
    "app:calendar": frozenset(
        {("read", category, "scheduling") for category in _SCHEDULER_READS}
        | {
            (action, category, "scheduling")
            for action in ("capture", "propose")
            for category in _SCHEDULER_WRITES
        }
        | {("capture", "conversation", "scheduling")}
        | {("consent", category, "scheduling") for category in _SCHEDULER_CONSENTS}
    ),
    "app:privacy-console": frozenset(
        {("erase", category, "erasure") for category in ALL_CATEGORIES}
        | {("export", category, "access-request") for category in ALL_CATEGORIES}
    ),
    "app:compliance-console": frozenset(
        ("audit", category, "compliance") for category in ALL_CATEGORIES
    ),
    OPERATORS: frozenset(
        {
            (action, category, purpose)
            for action, purpose in (
                ("inspect", "operations"),
                ("operate", "operations"),
                ("policy", "operations"),
                ("audit", "compliance"),
                ("erase", "erasure"),
                ("export", "access-request"),
            )
            for category in ALL_CATEGORIES
        }
    ),
    UNKNOWN_APP: frozenset(),
}


def expected_allowed(app: str, tenant: str, action: str, category: str, purpose: str) -> bool:
    """Return what the seed policy should decide for one request."""
    if tenant != "default":
        return False
    return (action, category, purpose) in ALLOWED_IN_DEFAULT.get(app, frozenset())
