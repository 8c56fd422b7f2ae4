"""One contract suite per storage port, bound to the in-memory fake, SQLite and PostgreSQL.

Each port's suite is a base class without the ``Test`` prefix whose tests take a
``stores`` fixture; ``Test...InMemory`` binds it to the fakes, ``Test...OnDatabase`` to
the SQL adapters on every backend of the ``backend`` fixture (tests/conftest.py), so a
new backend runs the contracts too. A fake that passes the suite its real adapters pass
cannot drift from them (P11).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.log import AuditLog
from tests.conftest import Backend
from tests.fakes.audit import InMemoryAuditStore
from tests.fakes.eventstore import InMemoryEventStore
from tests.fakes.keystore import InMemoryKeyStore
from tests.fakes.ports import FakeClock, InMemoryKeyMaterialStore
from uprof.backends import backend_for
from uprof.crypto.keystore import KekRing, KeyStore
from uprof.eventstore import ProfilesApplication
from uprof.ports import AuditStore, EventStore, SubjectKeyStore
from uprof.settings import Settings
from uprof.storage import create_engine, layout_for, migrate


@dataclass
class Stores:
    """The three stores of one flavour, built lazily, closed at teardown."""

    flavour: str
    settings: Settings | None
    clock: FakeClock
    _engines: dict[str, sa.Engine]
    _keys: SubjectKeyStore | None = None
    _events: EventStore | None = None
    _audit: AuditStore | None = None

    def _engine(self, store: str) -> sa.Engine:
        assert self.settings is not None
        if store not in self._engines:
            layout = layout_for(self.settings)
            url = {"views": layout.views_url, "keys": layout.keys_url, "events": layout.events_url}
            self._engines[store] = create_engine(url[store])
            if store in ("views", "keys"):
                migrate(self._engines[store], store)
        return self._engines[store]

    def keys(self) -> SubjectKeyStore:
        if self._keys is None:
            if self.flavour == "memory":
                self._keys = InMemoryKeyStore()
            else:
                self._keys = KeyStore(
                    self._engine("keys"),
                    master_secret=secrets.token_bytes(32),
                    kek_ring=KekRing(InMemoryKeyMaterialStore()),
                )
        return self._keys

    def events(self) -> EventStore:
        if self._events is None:
            if self.flavour == "memory":
                self._events = InMemoryEventStore(self.keys())
            else:
                assert self.settings is not None
                self._events = ProfilesApplication(
                    env=layout_for(self.settings).eventsourcing_env,
                    keystore=self.keys(),
                    events_engine=self._engine("events"),
                )
        return self._events

    def audit(self) -> AuditStore:
        if self._audit is None:
            if self.flavour == "memory":
                self._audit = InMemoryAuditStore(clock=self.clock.now)
            else:
                views = self._engine("views")
                self._audit = AuditLog(
                    views,
                    Ed25519PrivateKey.generate(),
                    "uprof.test/contracts",
                    backend=backend_for(views),
                    clock=self.clock.now,
                )
        return self._audit

    def close(self) -> None:
        if isinstance(self._events, ProfilesApplication):
            self._events.close()
        for engine in self._engines.values():
            engine.dispose()


@pytest.fixture
def memory_stores() -> Stores:
    """The in-memory fakes."""
    return Stores("memory", None, FakeClock(datetime(2026, 1, 1, 12, tzinfo=UTC)), {})


@pytest.fixture
def database_stores(backend: Backend) -> Iterator[Stores]:
    """The SQL adapters on a fresh store of each backend the ``backend`` fixture runs."""
    data_dir = backend.data_dir / "data"
    data_dir.mkdir(exist_ok=True)  # the schema template may have put the store files there
    settings = Settings(
        data_dir=data_dir,
        database_url=backend.url if backend.kind == "postgres" else None,
        embedder="hashing",
    )
    built = Stores(backend.kind, settings, FakeClock(datetime(2026, 1, 1, 12, tzinfo=UTC)), {})
    try:
        yield built
    finally:
        built.close()
