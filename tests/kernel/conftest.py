from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.keys import key_id
from domain.values import Interaction
from projections.profile.queries import IntentRow
from tests.conftest import OTHER_TENANT, Backend, seed_policy_for
from tests.fakes.ports import FakeClock, FakeExtractor
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.services.backup import _signed_bytes
from uprof.settings import Settings

if TYPE_CHECKING:
    from tests.children import PythonChild

APP = "app:planner"


def settings_for(backend: Backend) -> Settings:
    return Settings(
        data_dir=backend.data_dir / "data",
        database_url=backend.url if backend.kind == "postgres" else None,
        embedder="hashing",
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def cli_env(backend: Backend) -> dict[str, str]:
    """The environment of a ``uprof`` command run in its own process on the deployment
    ``settings_for(backend)`` describes."""
    settings = settings_for(backend)
    env = dict(os.environ, UPROF_DATA_DIR=str(settings.data_dir), UPROF_EMBEDDER="hashing")
    if backend.kind == "postgres":
        env["UPROF_DATABASE_URL"] = backend.url
    return env


def other_tenant(
    settings: Settings, folder: Path, tenant: str = OTHER_TENANT, seed: Path | None = None
) -> Settings:
    """``settings`` for another tenant on the same stores, whose policy is the rows of
    ``seed`` (default: the packaged seed) for that tenant (written into ``folder``)."""
    policy = seed_policy_for(tenant, folder, seed)
    return settings.model_copy(update={"tenant": tenant, "policy_path": policy})


def build_kernel(settings: Settings, clock: FakeClock) -> Uprof:
    """A deployment with the test fakes (one per process it stands for)."""
    return bootstrap(settings, clock=clock, embedder=HashingEmbedder(), extractor=FakeExtractor())


@contextmanager
def running(settings: Settings, clock: FakeClock) -> Iterator[Uprof]:
    """One start of the deployment, closed at the end (one process's lifetime)."""
    k = build_kernel(settings, clock)
    try:
        yield k
    finally:
        k.close()


@pytest.fixture
def kernel(backend: Backend, clock: FakeClock) -> Iterator[Uprof]:
    with running(settings_for(backend), clock) as k:
        yield k


def say(
    text: str,
    *,
    app: str = APP,
    agent: str = "agent:one",
    ref: str = "",
    day: int = 1,
    sharing: str = "shared",
    purpose: str = "personalization",
    session: str = "s1",
) -> Interaction:
    return Interaction(
        app_id=app,
        agent_id=agent,
        occurred_at=datetime(2025, 1, day, 9, tzinfo=UTC),
        user_input=text,
        source_ref=ref,
        sharing=sharing,
        purpose=purpose,
        session_id=session,
    )


def consent(kernel: Uprof, subject: str = "alice", app: str = APP, categories=("*",)) -> str:
    return kernel.grant_consent(
        subject, app_id=app, categories=list(categories), purposes=["personalization"]
    )


#: A word no other text holds, so a leak of the erased item shows in any dump.
SAIL = "Qzxsailcanary"


def sign_backup_manifest(folder: Path, key: Ed25519PrivateKey) -> None:
    """Sign the manifest of the backup in ``folder`` with ``key`` in place of its own
    signature, as whoever holds that key (a leaked old one, a stranger's) could."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["signature"] = {
        "algorithm": "ed25519",
        "key_id": key_id(key),
        "value": base64.b64encode(key.sign(_signed_bytes(manifest))).decode(),
    }
    path.write_text(json.dumps(manifest))


def sail_intent_of_alice(kernel: Uprof, sailing: str = SAIL) -> IntentRow:
    """Alice consented and holding one processed intent, to learn to ``sailing`` (by
    default a canary word), the one an erasure test erases."""
    consent(kernel)
    kernel.capture("alice", say(f"I want to learn to {sailing}", ref="sail"))
    kernel.process()
    (intent,) = kernel.profile("alice").intents
    return intent


def child_on(script: str, backend: Backend) -> AbstractContextManager[PythonChild]:
    """``script`` run in a child process (``streaming_child``) with the deployment's data
    folder and database URL (empty on SQLite) as its two arguments."""
    # Imported here: the fork server imports this module before tests.children, whose
    # import checks what the other modules left running there.
    from tests.children import streaming_child

    url = backend.url if backend.kind == "postgres" else ""
    return streaming_child(script, str(settings_for(backend).data_dir), url)


def consented_settings(backend: Backend, subject: str = "alice") -> Settings:
    """The settings of a deployment where ``subject`` granted ``APP`` consent to every
    category (one start, closed: each test then starts its own processes)."""
    settings = settings_for(backend)
    with running(settings, FakeClock()) as setup:
        consent(setup, subject)
    return settings


def erased_and_recreated_while_profile_is_read(
    kernel: Uprof, settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Make ``kernel.profile`` run, right after its read, an erasure of ``alice`` and a
    re-creation of the name in another kernel on the same stores (another process, inside
    the window of a recorded read). Returns the list the new pseudonym is appended to."""
    read_profile = kernel.profile
    new_pseudonyms: list[str] = []

    def profile_then_erased_elsewhere(subject: str, **kwargs: Any) -> Any:
        view = read_profile(subject, **kwargs)
        with running(settings, clock) as other:
            other.erase_subject("alice")
            new_pseudonyms.append(other.recreate_subject("alice"))
        return view

    monkeypatch.setattr(kernel, "profile", profile_then_erased_elsewhere)
    return new_pseudonyms


def plant_file(kernel: Uprof, name: str, data: bytes) -> Path:
    """A file of the deployment's exports folder holding ``data``, for the residue audit
    to find."""
    path = kernel.settings.data_dir / "exports" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def residue_found(kernel: Uprof, term: str, where: str) -> list[str]:
    """The locations of a whole residue audit's plaintext findings of ``term`` that
    mention ``where``."""
    report = kernel.residue_scan([term])
    return [
        f.location
        for f in report.findings
        if f.kind == "plaintext" and f.detail == f"term {term!r}" and where in f.location
    ]
