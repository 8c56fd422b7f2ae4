"""The uprof SDK: typed clients for the REST API, and an embedded mode with the same interface.

>>> # from uprof.sdk import Client
>>> # client = Client("http://127.0.0.1:8765", api_key)        # over HTTP
>>> # client = Client.embedded(kernel, app_id="app:planner")   # in this process

Public names are imported explicitly and listed in ``__all__``; a test fails when
this surface changes (tests/api/test_sdk_surface.py).
"""

from uprof.schemas.api import (
    AttributeOut,
    AttributeProposalIn,
    AuditExport,
    AuditKey,
    AuditVerification,
    CaptureAck,
    CapturedEvent,
    Consent,
    ConsentWithdrawn,
    ErasureReceipt,
    Evidence,
    ExperienceProposalIn,
    FieldProblem,
    IntentOut,
    IntentProposalIn,
    IntentUpdateIn,
    InteractionBody,
    LeftOutItem,
    MemoryOut,
    MemoryProposalIn,
    Profile,
    ProfileSlice,
    SliceItem,
    WhoAmI,
)
from uprof.sdk._client import AsyncClient, Client
from uprof.sdk._errors import (
    APIError,
    AuthenticationError,
    ConflictError,
    GoneError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServerError,
    ServiceUnavailableError,
    TransportError,
    UprofClientError,
)

__all__ = [
    "APIError",
    "AsyncClient",
    "AttributeOut",
    "AttributeProposalIn",
    "AuditExport",
    "AuditKey",
    "AuditVerification",
    "AuthenticationError",
    "CaptureAck",
    "CapturedEvent",
    "Client",
    "ConflictError",
    "Consent",
    "ConsentWithdrawn",
    "ErasureReceipt",
    "Evidence",
    "ExperienceProposalIn",
    "FieldProblem",
    "GoneError",
    "IntentOut",
    "IntentProposalIn",
    "IntentUpdateIn",
    "InteractionBody",
    "InvalidRequestError",
    "LeftOutItem",
    "MemoryOut",
    "MemoryProposalIn",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Profile",
    "ProfileSlice",
    "ServerError",
    "ServiceUnavailableError",
    "SliceItem",
    "TransportError",
    "UprofClientError",
    "WhoAmI",
]
