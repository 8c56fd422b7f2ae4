from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from domain.values import Interaction
from tests.conftest import OTHER_TENANT, Backend, seed_policy_for
from tests.fakes.ports import FakeClock, FakeExtractor
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.settings import Settings

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
