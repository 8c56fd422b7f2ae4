"""A stream whose first readable row is not its opening, and a stream whose keys are
missing though it was never erased (review of 0130, bugs GC and GD; both backends, each
start its own kernel as a process would be).

Bug EX's fix made a shredded first row say "erased": right when the keys were destroyed
by an erasure, but the same row reads as shredded in two damaged stores too, and the
subject was never erased. The pipeline takes "erased" at its word: the extraction batch
skips the subject's captures and moves its position past them (``continue`` on
``SubjectErasedError``), so a false "erased" silently loses work that a repaired store
(the right key folder back) would have done. And a stream whose first row is any other
event (its opening row deleted, or overwritten by a plaintext row, which needs no key)
still failed with the event library's bare ``AssertionError``, as EX did.
"""

from __future__ import annotations

from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.errors import StoredDataDamagedError, SubjectErasedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.stored_rows import rewrite_row, stored_rows
from tests.kernel.test_forged_plain_row import _delete, _forged
from uprof.crypto.keydir import KeyMaterialError
from uprof.crypto.tables import subject_keys
from uprof.kernel import Uprof

CATS, PURPOSE = ["preferences"], "personalization"


def _alice(backend: Backend, clock: FakeClock, captures: int = 1) -> UUID:
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        for i in range(captures):
            k.capture("alice", say(f"I live in Lisbon and I like tea number {i}"))
        k.process_once()
        return k.stream_of("alice")


def _damage_named(k: Uprof, stream: UUID) -> None:
    """Every way in names the damage: never "erased", never an anonymous error."""
    with pytest.raises(StoredDataDamagedError):
        k.app.load(stream)
    with pytest.raises(StoredDataDamagedError):
        k.unconsented("alice", APP, CATS, PURPOSE)


def test_a_stream_without_its_opening_row_is_named_damage(
    backend: Backend, clock: FakeClock
) -> None:
    """The ``Registered`` row (version 1) deleted: the first row left is a consent. On
    main it failed with the event library's bare ``AssertionError`` (GC)."""
    stream = _alice(backend, clock)
    with running(settings_for(backend), clock) as k:
        _delete(k, stream, 1)
    with running(settings_for(backend), clock) as k:
        _damage_named(k, stream)


def test_a_stream_opened_by_a_forged_plaintext_row_is_named_damage(
    backend: Backend, clock: FakeClock
) -> None:
    """Version 1 overwritten by a plaintext ``DamagedEventQuarantined`` (no key needed to
    build one): on main the bare ``AssertionError`` again (GC)."""
    stream = _alice(backend, clock)
    with running(settings_for(backend), clock) as k:
        rewrite_row(k, stream, 1, *_forged(k, stream, 1, "verdict"))
    with running(settings_for(backend), clock) as k:
        _damage_named(k, stream)


def test_a_stream_whose_first_row_left_is_an_erased_capture_is_not_erased(
    backend: Backend, clock: FakeClock
) -> None:
    """One capture of alice erased (its key destroyed: an event erasure), then the rows
    before it deleted: the first row left reads as shredded. alice was never erased, but
    on main every surface said so (410 ``subject_erased``), and the pipeline skipped her
    (GC)."""
    stream = _alice(backend, clock, captures=2)
    with running(settings_for(backend), clock) as k:
        rows = stored_rows(k, stream)
        version, _, state = next(r for r in rows if r[1].endswith(".InteractionCaptured"))
        assert state[:1] == b"\x02"  # sealed under the capture's own key
        assert k.keystore.destroy_capture_key(str(stream), state[1:17].hex()) is not None
        for v in range(1, version):
            _delete(k, stream, v)
    with running(settings_for(backend), clock) as k:
        assert not k.keystore.is_shredded(str(stream))
        _damage_named(k, stream)


def test_held_keys_missing_without_an_erasure_stop_the_start(
    backend: Backend, clock: FakeClock
) -> None:
    """Held: alice's subject keys gone from the key store without an erasure (a key
    folder put back from an older copy, a damaged key store) would read as shredded, and
    a load would say "erased"; but the next start refuses to serve, naming the lost keys
    (``KeyMaterialError``), so no batch takes her for erased. With the keys put back the
    capture is extracted."""
    stream = _alice(backend, clock, captures=0)
    with running(settings_for(backend), clock) as k:
        k.capture("alice", say("I live in Lisbon and I like green tea"))
        where = subject_keys.c.stream_id == str(stream)
        with k.keys_engine.begin() as conn:
            saved = [dict(r._mapping) for r in conn.execute(sa.select(subject_keys).where(where))]
            assert saved
            conn.execute(subject_keys.delete().where(where))
    with pytest.raises(KeyMaterialError, match="lacks the data keys of 1 subjects"):
        with running(settings_for(backend), clock):
            pass
    keys = sa.create_engine(_keys_url(backend))
    try:
        with keys.begin() as conn:
            conn.execute(subject_keys.insert(), saved)
    finally:
        keys.dispose()
    with running(settings_for(backend), clock) as k:
        k.process_once()
        assert k.app.load(stream).memory_count == 1


def _keys_url(backend: Backend) -> str:
    settings = settings_for(backend)
    if backend.kind == "postgres":
        assert settings.database_url is not None
        return settings.database_url
    return f"sqlite:///{settings.key_path / 'keys.sqlite'}"


def test_held_a_real_erasure_still_says_erased(backend: Backend, clock: FakeClock) -> None:
    """The checks above do not turn a real erasure into damage."""
    stream = _alice(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.erase_subject("alice")
    with running(settings_for(backend), clock) as k:
        with pytest.raises(SubjectErasedError):
            k.app.load(stream)
