"""Authorization for uprof: Casbin policy and the visibility rule of shared agent memory.

Policy requests are app x tenant x action x category x purpose; deny wins, deny by default.
``model.conf`` and ``seed_policy.csv`` are data, reviewed like code; ``CasbinAuthorizer``
raises ``PermissionDeniedError`` on deny. Consent is checked by the kernel, not here.
"""

from policies.authorizer import (
    AccessDecision,
    CacheStats,
    CasbinAuthorizer,
    PolicyDeniedError,
    PolicyTableRow,
    copy_seed_policy,
    packaged_model_text,
    packaged_seed_policy_text,
)
from policies.rules import (
    ACTIONS,
    ALLOW,
    ANY_PURPOSE,
    DENY,
    ROOT_CATEGORY,
    PolicyError,
    PolicyRule,
    RoleAssignment,
)
from policies.visibility import is_visible

__all__ = [
    "ACTIONS",
    "ALLOW",
    "ANY_PURPOSE",
    "DENY",
    "ROOT_CATEGORY",
    "AccessDecision",
    "CacheStats",
    "CasbinAuthorizer",
    "PolicyDeniedError",
    "PolicyError",
    "PolicyRule",
    "PolicyTableRow",
    "RoleAssignment",
    "copy_seed_policy",
    "is_visible",
    "packaged_model_text",
    "packaged_seed_policy_text",
]
