"""The KeyMaterialStore port: one contract for the key folder and for the in-memory fake."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tests import children
from tests.fakes.ports import FakeClock, FakeExtractor, InMemoryKeyMaterialStore
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.crypto.keydir import FileKeyMaterialStore
from uprof.ports import ErasureRecord, KeyMaterialStore
from uprof.settings import Settings


class KeyMaterialContract:
    @pytest.fixture
    def store(self, tmp_path: Path) -> KeyMaterialStore:
        raise NotImplementedError

    def test_secrets_are_created_once_and_stay(self, store: KeyMaterialStore) -> None:
        assert not store.has_master_secret()
        master = store.master_secret()
        assert store.has_master_secret()
        assert len(master) >= 32 and store.master_secret() == master
        ring = store.load_kek_ring()
        assert list(ring) == [1] and len(ring[1]) == 32
        assert store.load_kek_ring() == ring
        key = store.audit_signing_key()
        assert key.public_key().public_bytes_raw() == (
            store.audit_signing_key().public_key().public_bytes_raw()
        )

    def test_a_saved_ring_replaces_the_old_one(self, store: KeyMaterialStore) -> None:
        ring = store.load_kek_ring()
        store.save_kek_ring({**ring, 2: b"\x02" * 32})
        store.save_kek_ring({2: b"\x02" * 32})
        assert store.load_kek_ring() == {2: b"\x02" * 32}

    def test_erasure_records_read_back_in_order(self, store: KeyMaterialStore) -> None:
        assert list(store.erasure_records()) == []
        first = ErasureRecord("subject", "t", "2026-01-01T00:00:00+00:00", "s1", "m1", (), "r1")
        second = ErasureRecord("captures", "t", "2026-01-02T00:00:00+00:00", "s2", None, ("c",))
        unfinished = ErasureRecord(
            "incomplete", "t", "2026-01-03T00:00:00+00:00", "s3", "m3", (), "r3", '{"rows":2}'
        )
        receipted = ErasureRecord("receipted", "t", "2026-01-04T00:00:00+00:00", request_id="r3")
        items = ErasureRecord(
            "items", "t", "2026-01-05T00:00:00+00:00", "s4", "m4", request_id="r4", item_ids=("i",)
        )
        fingerprinted = ErasureRecord(
            "items", "t", "2026-01-06T00:00:00+00:00", "s5", "m5", item_ids=("j",),
            fingerprints=("f1", "f2"),
        )  # fmt: skip
        records = (first, second, unfinished, receipted, items, fingerprinted)
        for record in records:
            store.append_erasure(record)
        assert list(store.erasure_records()) == list(records)


class TestFileKeyMaterialStore(KeyMaterialContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> KeyMaterialStore:
        return FileKeyMaterialStore(tmp_path / "keys")

    def test_another_instance_sees_appends(self, tmp_path: Path) -> None:
        a, b = FileKeyMaterialStore(tmp_path / "k"), FileKeyMaterialStore(tmp_path / "k")
        a.append_erasure(ErasureRecord("subject", "t", "x", "s1"))
        assert [r.stream_id for r in b.erasure_records()] == ["s1"]
        b.append_erasure(ErasureRecord("subject", "t", "y", "s2"))
        assert [r.stream_id for r in a.erasure_records()] == ["s1", "s2"]

    def test_files_are_private(self, store: FileKeyMaterialStore) -> None:
        store.master_secret()
        store.load_kek_ring()
        store.audit_signing_key()
        for path in store.path.iterdir():
            assert path.stat().st_mode & 0o077 == 0, path.name


class TestInMemoryKeyMaterialStore(KeyMaterialContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> KeyMaterialStore:
        return InMemoryKeyMaterialStore()


def _first_ring(folder: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = FileKeyMaterialStore(Path(folder))
    queue.put((store.load_kek_ring()[1], store.master_secret()))


def test_processes_starting_together_get_the_same_ring_and_secret(tmp_path: Path) -> None:
    """The old KekRing could let a second process overwrite the first one's new ring."""
    ctx = children.CONTEXT
    for attempt in range(1):
        folder = tmp_path / f"k{attempt}"
        queue = ctx.Queue()
        procs = [ctx.Process(target=_first_ring, args=(str(folder), queue)) for _ in range(4)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert len(set(results)) == 1


def test_bootstrap_takes_another_key_material_store(tmp_path: Path) -> None:
    """A secrets manager is a new class passed to bootstrap: no caller changes."""
    store = InMemoryKeyMaterialStore()
    settings = Settings(data_dir=tmp_path / "data", embedder="hashing")
    k = bootstrap(
        settings,
        clock=FakeClock(),
        embedder=HashingEmbedder(),
        extractor=FakeExtractor(),
        key_material=store,
    )
    try:
        k.grant_consent(
            "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
        )
        k.erase_subject("alice")
        # The erasure's record (with its receipt's draft), then its receipt (decision 0052).
        assert [r.kind for r in store.erasure_records()] == ["subject", "receipted"]
        assert k.subjects.is_erased("alice")
    finally:
        k.close()
    for name in ("master.key", "keks.json", "audit-signing.pem", "erasure-ledger.jsonl"):
        assert not (settings.key_path / name).exists()


def _hold_in_flight(folder: Path, request_id: str, held: object, done: object) -> None:
    store = FileKeyMaterialStore(folder)
    with store.erasure_in_flight(request_id):
        held.set()  # type: ignore[attr-defined]
        done.wait(60)  # type: ignore[attr-defined]


def test_an_erasure_in_flight_is_dead_only_once_its_process_is(tmp_path: Path) -> None:
    """GY's mark, across real processes: a request held by a live process is not taken
    for dead; killed (SIGKILL), it is, and once; a request that finished leaves no mark
    (not dead either); and no path outside the folder can be named."""
    folder = tmp_path / "keys"
    store = FileKeyMaterialStore(folder)
    request_id = "0b7c3d4e-1f2a-4b5c-8d9e-0a1b2c3d4e5f"
    ctx = children.CONTEXT
    held, done = ctx.Event(), ctx.Event()
    owner = ctx.Process(target=_hold_in_flight, args=(folder, request_id, held, done))
    owner.start()
    assert held.wait(60)
    with store.erasure_owner_gone(request_id) as gone:
        assert gone is False  # alive
    owner.kill()
    owner.join(60)
    with store.erasure_owner_gone(request_id) as gone:
        assert gone is True
    with store.erasure_owner_gone(request_id) as gone:
        assert gone is False  # settled: the mark went with it
    with store.erasure_in_flight(request_id):
        pass
    with store.erasure_owner_gone(request_id) as gone:
        assert gone is False  # finished: no mark left
    with pytest.raises(ValueError):
        with store.erasure_in_flight("../../etc/passwd"):
            pass
    with store.erasure_owner_gone("../../etc/passwd") as gone:
        assert gone is False  # a start reading an odd id on the log goes on
    with pytest.raises(RuntimeError), store.erasure_in_flight(request_id):
        raise RuntimeError("refused")  # its outcome written inside: no mark left
    with store.erasure_owner_gone(request_id) as gone:
        assert gone is False
    assert not list((folder / "erasures-in-flight").iterdir())


def test_a_look_at_an_erasure_mark_tells_its_state_and_takes_nothing(tmp_path: Path) -> None:
    """PS (decision 0198-residue-in-progress): the residue audit's look at a request's
    mark, across real processes: ``held`` while a live process holds it (a second look
    at once says the same), ``free`` once that process is killed, and the look neither
    takes nor removes it (a start still finds it dead, once); ``host:NAME`` for another
    host's mark; ``none`` for no mark or an id that is not one. A process finishing the
    request takes the mark only when no live process holds it."""
    folder = tmp_path / "keys"
    store = FileKeyMaterialStore(folder)
    request_id = "0b7c3d4e-1f2a-4b5c-8d9e-0a1b2c3d4e60"
    assert store.erasure_mark_state(request_id) == "none"
    assert store.erasure_mark_state("../../etc/passwd") == "none"
    ctx = children.CONTEXT
    held, done = ctx.Event(), ctx.Event()
    owner = ctx.Process(target=_hold_in_flight, args=(folder, request_id, held, done))
    owner.start()
    assert held.wait(60)
    assert store.erasure_mark_state(request_id) == "held"
    assert FileKeyMaterialStore(folder).erasure_mark_state(request_id) == "held"
    with store.erasure_finishing(request_id) as taken:
        assert taken is False  # its live process finishes it
    owner.kill()
    owner.join(60)
    assert store.erasure_mark_state(request_id) == "free"
    assert store.erasure_mark_state(request_id) == "free"  # looked at, not removed
    with store.erasure_finishing(request_id) as taken:
        assert taken is True
        assert FileKeyMaterialStore(folder).erasure_mark_state(request_id) == "held"
    assert store.erasure_mark_state(request_id) == "none"  # finished: gone
    other = "1b7c3d4e-1f2a-4b5c-8d9e-0a1b2c3d4e61"
    (folder / "erasures-in-flight" / f"{other}.lock").write_text("host=elsewhere-7\n")
    assert store.erasure_mark_state(other) == "host:elsewhere-7"
