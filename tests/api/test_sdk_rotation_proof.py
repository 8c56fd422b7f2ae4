"""The SDK's ``audit_rotation_proof`` (decision 0170-restore-edges) against the live
server: the proof for a receipt issued before an audit key rotation, which then checks
offline with the key history; sync, async and embedded clients alike."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import httpx
import pytest

from audit._codec import b64encode
from audit.errors import VerificationError
from audit.receipts import verify_receipt
from domain.principal import Principal
from tests.api.conftest import PLANNER, Apps, LiveServer
from uprof.facade import Facade
from uprof.kernel import Uprof
from uprof.sdk import (
    AsyncClient,
    Client,
    InvalidRequestError,
    PermissionDeniedError,
    ReceiptRotationProof,
    TransportError,
)

WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


def _pre_rotation_receipt(server: LiveServer, apps: Apps, kernel: Uprof) -> dict[str, object]:
    """A receipt for bob's erasure; the log grows past it, then the audit key rotates."""
    with Client(server.url, apps.planner_operator) as client:
        consent_id = client.grant_consent(
            "bob", categories=["*"], purposes=["personalization"], collected_by="consent-ui:t"
        )
        client.capture("bob", agent_id="agent:one", user_input="I keep bees", occurred_at=WHEN)
        withdrawn = client.withdraw_consent("bob", consent_id, erase=True)
        assert withdrawn.erasure is not None
        client.grant_consent(
            "carol", categories=["*"], purposes=["personalization"], collected_by="consent-ui:t"
        )
    Facade(kernel, Principal.local_operator(kernel.subjects.tenant)).rotate_audit_key()
    return dict(withdrawn.erasure.receipt)


@pytest.mark.parametrize("mode", ["sync", "async", "embedded"])
def test_the_sdk_gets_a_rotation_proof_that_verifies_the_receipt_offline(
    server: LiveServer, apps: Apps, kernel: Uprof, mode: str
) -> None:
    with Client(server.url, apps.planner_operator) as client:
        pinned = client.audit_key()
    receipt = _pre_rotation_receipt(server, apps, kernel)
    with Client(server.url, apps.planner_operator) as client:
        history = client.audit_key().key_history
    assert history is not None
    origin, pem = pinned.origin, pinned.public_key_pem
    with pytest.raises(VerificationError, match="rotation_proof"):
        verify_receipt(receipt, pem, origin=origin, key_history=history)

    if mode == "embedded":
        with Client.embedded(kernel, PLANNER, roles=("app", "operator")) as client:
            proof = client.audit_rotation_proof(json.dumps(receipt))
    elif mode == "sync":
        with Client(server.url, apps.planner_operator) as client:
            proof = client.audit_rotation_proof(receipt)
    else:

        async def ask() -> ReceiptRotationProof:
            async with AsyncClient(server.url, apps.planner_operator) as client:
                return await client.audit_rotation_proof(receipt)

        proof = asyncio.run(ask())

    assert proof.tree_size < (proof.rotation_point or 0)
    assert proof.rotation_proof is not None
    verify_receipt(
        receipt, pem, origin=origin, key_history=history, rotation_proof=proof.rotation_proof
    )


def test_the_sdk_refuses_an_app_without_the_operator_role_and_a_receipt_that_is_not_one(
    server: LiveServer, apps: Apps
) -> None:
    with Client(server.url, apps.planner) as client, pytest.raises(PermissionDeniedError):
        client.audit_rotation_proof('{"body": 1}')
    with Client(server.url, apps.planner_operator) as client:
        with pytest.raises(InvalidRequestError, match="receipt"):
            client.audit_rotation_proof("not json")
        with pytest.raises(InvalidRequestError, match="receipt"):
            client.audit_rotation_proof("")  # refused before sending


def test_a_hostile_servers_rotation_proof_makes_no_receipt_verify(
    server: LiveServer, apps: Apps, kernel: Uprof
) -> None:
    """Review of 0170: the SDK hands over what the server answered without checking it
    (it holds no key history to check it with), so what a server says can matter only
    through ``verify_receipt``, which checks the proof against the caller's pinned key
    history. A proof of another receipt's size, a cut or padded one, a null one: none
    makes the receipt verify; wrong types are the SDK's ``TransportError``."""
    with Client(server.url, apps.planner_operator) as client:
        pinned = client.audit_key()
    receipt = _pre_rotation_receipt(server, apps, kernel)
    with Client(server.url, apps.planner_operator) as client:
        history = client.audit_key().key_history
        real = client.audit_rotation_proof(receipt)
    assert real.rotation_proof and real.rotation_point is not None
    other = kernel.audit_log.consistency_proof(real.tree_size - 1, real.rotation_point)
    forged = {
        "another size's": [b64encode(h) for h in other],
        "cut": real.rotation_proof[:-1],
        "padded": [*real.rotation_proof, real.rotation_proof[0]],
        "null": None,
    }
    for hashes in forged.values():
        answer = {**real.model_dump(), "rotation_proof": hashes}
        transport = httpx.MockTransport(lambda _r, a=answer: httpx.Response(200, json=a))
        with Client("http://uprof.test", "k", transport=transport) as client:
            told = client.audit_rotation_proof(receipt)
        with pytest.raises(VerificationError):
            verify_receipt(
                receipt,
                pinned.public_key_pem,
                origin=pinned.origin,
                key_history=history,
                rotation_proof=told.rotation_proof,
            )
    for wrong in ({"rotation_proof": "abc"}, {"tree_size": "many"}, [1], "x" * 100_000):
        answer = {**real.model_dump(), **wrong} if isinstance(wrong, dict) else wrong
        transport = httpx.MockTransport(lambda _r, a=answer: httpx.Response(200, json=a))
        with Client("http://uprof.test", "k", transport=transport) as client:
            with pytest.raises(TransportError, match="receipt_rotation_proof"):
                client.audit_rotation_proof(receipt)


@pytest.mark.parametrize("mode", ["sync", "async", "embedded"])
def test_the_sdk_gets_the_rotation_proof_of_an_export_taken_before_a_rotation(
    server: LiveServer, apps: Apps, kernel: Uprof, mode: str
) -> None:
    """Decision 0175-retired-below: an export (its header's note) signed before the
    rotation needs the same proof as a receipt (bug LK); ``checkpoint=`` asks for it."""
    from audit.checkpoint import verify_checkpoint
    from audit.keyring import trusted_keys

    with Client(server.url, apps.planner_operator) as client:
        pinned = client.audit_key()
    note = pinned.checkpoint
    _pre_rotation_receipt(server, apps, kernel)  # the log grows, then the key rotates
    with Client(server.url, apps.planner_operator) as client:
        keys = trusted_keys(pinned.public_key_pem, client.audit_key().key_history)
    with pytest.raises(VerificationError, match="uprof audit rotation-proof"):
        verify_checkpoint(note, keys, pinned.origin)

    if mode == "embedded":
        with Client.embedded(kernel, PLANNER, roles=("app", "operator")) as client:
            proof = client.audit_rotation_proof(checkpoint=note)
    elif mode == "sync":
        with Client(server.url, apps.planner_operator) as client:
            proof = client.audit_rotation_proof(checkpoint=note)
    else:

        async def ask() -> ReceiptRotationProof:
            async with AsyncClient(server.url, apps.planner_operator) as client:
                return await client.audit_rotation_proof(checkpoint=note)

        proof = asyncio.run(ask())

    assert proof.receipt_id is None and proof.rotation_proof is not None
    assert proof.tree_size < (proof.rotation_point or 0)
    verify_checkpoint(note, keys, pinned.origin, rotation_proof=proof.rotation_proof)
    with Client(server.url, apps.planner_operator) as client:
        with pytest.raises(InvalidRequestError, match="checkpoint"):
            client.audit_rotation_proof(checkpoint="not a note")
        with pytest.raises(TypeError):
            client.audit_rotation_proof(json.dumps({}), checkpoint=note)
