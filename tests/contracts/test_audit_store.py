"""AuditStore contract: the in-memory fake, SQLite and PostgreSQL behave alike."""

from __future__ import annotations

import pytest

import audit.log as audit_log_module
from audit.errors import AuditEntryError
from audit.merkle import verify_inclusion
from domain.errors import InvalidInputError
from tests.contracts.conftest import Stores


def entry(i: int, **extra: object) -> dict[str, object]:
    return {
        "action": "consent.granted" if i % 2 else "AccessDecision",
        "app_id": f"app-{i % 3}",
        "subject_ref": f"sub_{i % 2:04d}",
        "purpose": "personalization",
        **extra,
    }


class AuditStoreContract:
    """What every AuditStore must do (bound to a flavour by the classes at the end)."""

    def test_an_empty_log_has_size_zero_and_the_empty_root(self, stores: Stores) -> None:
        log = stores.audit()
        assert log.size() == 0
        assert log.root() == bytes.fromhex(
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        )  # RFC 9162 §2.1.1: the hash of the empty string
        assert list(log.entries()) == []

    def test_each_append_moves_the_head_and_lands_at_the_next_index(self, stores: Stores) -> None:
        log = stores.audit()
        roots = [log.root()]
        for i in range(5):
            record = log.append(entry(i))
            assert record.leaf_index == i
            roots.append(log.root())
        assert log.size() == 5
        assert len(set(roots)) == 6  # every append changed the head
        assert log.root(3) == roots[3]  # an older head can still be recomputed

    def test_append_many_is_consecutive_and_all_or_nothing(self, stores: Stores) -> None:
        log = stores.audit()
        log.append(entry(0))
        records = log.append_many([entry(1), entry(2)])
        assert [r.leaf_index for r in records] == [1, 2]
        head = log.root()
        with pytest.raises(AuditEntryError):
            log.append_many([entry(3), entry(4, email="alice@example.org")])  # not allowlisted
        assert log.size() == 3 and log.root() == head

    def test_append_many_once_by_leaves_out_what_the_log_already_holds(
        self, stores: Stores
    ) -> None:
        log = stores.audit()
        first = [entry(1, request_id="r1"), entry(1, request_id="r2")]
        assert len(log.append_many(first, once_by=("request_id",))) == 2
        again = [
            entry(1, request_id="r2"),  # held: left out
            entry(2, request_id="r2"),  # another action and subject: written
            entry(1, request_id="r3"),
            entry(1, request_id="r3"),  # twice in the batch: once
        ]
        records = log.append_many(again, once_by=("request_id",))
        assert [r.leaf_index for r in records] == [2, 3]
        assert log.append_many(again, once_by=("request_id",)) == []
        assert log.size() == 4
        assert len(log.append_many([entry(1, request_id="r1")])) == 1  # without: always

    def test_holding_reads_the_entries_of_an_action_subject_and_values(
        self, stores: Stores
    ) -> None:
        """What ``once_by`` would find, for a caller that builds entries from it (the
        extraction worker's check, decision 0101-capture-accepted-reconciled): an integer
        value matches exactly (42 is not 420, whose text contains it)."""
        log = stores.audit()
        log.append_many(
            [
                entry(1, notification_id=42),
                entry(1, notification_id=420),
                entry(0, notification_id=42),  # another action and subject
                entry(3, notification_id=7),  # the same action and subject
            ]
        )
        found = log.holding("consent.granted", ["sub_0001"], "notification_id", [42, 7, 8])
        assert sorted(e["notification_id"] for e in found) == [7, 42]
        assert log.holding("consent.granted", ["sub_0001"], "notification_id", [4]) == []
        assert log.holding("consent.granted", [], "notification_id", [42]) == []
        log.append_many([entry(1, request_id="r_1"), entry(1, request_id="rx1")])
        (held,) = log.holding("consent.granted", ["sub_0001"], "request_id", ["r_1"])
        assert held["request_id"] == "r_1"  # "_" matches any character in LIKE: parsed

    def test_once_by_finds_a_value_inside_a_stored_list_and_under_either_name(
        self, stores: Stores
    ) -> None:
        """A capture request's ``key.created`` lists its keys' commitments; a late entry
        for one of them (an event erasure's, decision 0085) names it alone: a position
        of ``once_by`` may read several field names, and a list matches item by item."""
        log = stores.audit()
        a, b, c, d = (f"{n:064x}" for n in range(1, 5))
        identity = ("request_id", ("dek_commitment", "dek_commitments"))
        log.append_many(
            [
                entry(1, dek_commitments=[a, b]),  # a capture request's two keys
                entry(1, dek_commitment=c),  # a subject key
            ]
        )
        late = [entry(1, dek_commitments=[x]) for x in (a, b, c, d, d)]
        records = log.append_many(late, once_by=identity)
        assert len(records) == 1  # only d's, once
        assert log.append_many(late, once_by=identity) == []
        assert log.append_many([entry(1, dek_commitment=d)], once_by=identity) == []
        # Held only when every item is: [a, e] is written (e is nowhere).
        e = f"{5:064x}"
        assert len(log.append_many([entry(1, dek_commitments=[a, e])], once_by=identity)) == 1
        # Another action or subject holds nothing for these.
        assert len(log.append_many([entry(2, dek_commitments=[a])], once_by=identity)) == 1
        # A request id tells destructions apart as before.
        gone = [entry(1, request_id="r1", dek_commitment=a)] * 2
        assert len(log.append_many(gone, once_by=identity)) == 1
        assert (
            len(log.append_many([entry(1, request_id="r2", dek_commitment=a)], once_by=identity))
            == 1
        )

    def test_entries_read_back_in_leaf_order_filtered_and_from_a_position(
        self, stores: Stores
    ) -> None:
        log = stores.audit()
        records = log.append_many([entry(i) for i in range(6)])
        stored = list(log.entries())
        assert [s.leaf_index for s in stored] == list(range(6))
        assert [s.leaf_hash for s in stored] == [r.leaf_hash for r in records]
        assert stored[4].entry["app_id"] == "app-1"
        assert [s.leaf_index for s in log.entries(after_leaf=3)] == [4, 5]
        assert [s.leaf_index for s in log.entries(tree_size=2)] == [0, 1]
        assert [s.leaf_index for s in log.entries(action="consent.granted")] == [1, 3, 5]
        assert [s.leaf_index for s in log.entries(subject_ref="sub_0000", app_id="app-0")] == [0]
        assert [s.leaf_index for s in log.entries(page_size=2)] == list(range(6))

    def test_entries_filter_by_recording_time(self, stores: Stores) -> None:
        log = stores.audit()
        for i in range(3):
            log.append(entry(i))
            stores.clock.advance(hours=1)
        times = [s.recorded_at for s in log.entries()]
        assert len(set(times)) == 3
        assert [s.leaf_index for s in log.entries(since=times[1])] == [1, 2]
        assert [s.leaf_index for s in log.entries(until=times[1])] == [0]

    def test_an_inclusion_proof_leads_to_the_head(self, stores: Stores) -> None:
        log = stores.audit()
        records = log.append_many([entry(i) for i in range(7)])
        root = log.root()
        for r in records:
            verify_inclusion(r.leaf_hash, r.leaf_index, 7, log.inclusion_proof(r.leaf_index), root)
        with pytest.raises(InvalidInputError):
            log.inclusion_proof(7)
        with pytest.raises(InvalidInputError):
            log.root(8)


class TestAuditStoreInMemory(AuditStoreContract):
    @pytest.fixture
    def stores(self, memory_stores: Stores) -> Stores:
        return memory_stores


class TestAuditStoreOnDatabase(AuditStoreContract):
    @pytest.fixture
    def stores(self, database_stores: Stores) -> Stores:
        return database_stores

    def test_once_by_reads_the_entries_of_its_own_values_not_the_subjects_history(
        self, stores: Stores, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The check runs under the log's write lock, which every append waits for: it
        must not read (and parse) every entry of the subject's history of that action, which
        grows with each event erasure (10,000 erased events: +45 ms per erasure on SQLite,
        50,000: +216 ms, measured 2026-12-05), only those that can match."""
        log = stores.audit()
        log.append_many([entry(1, request_id=f"old-{i}") for i in range(300)])
        parsed: list[str] = []
        loads = audit_log_module.json.loads

        def counting(text: str) -> object:
            parsed.append(text)
            return loads(text)

        monkeypatch.setattr(audit_log_module.json, "loads", counting)
        assert len(log.append_many([entry(1, request_id="new")], once_by=("request_id",))) == 1
        assert log.append_many([entry(1, request_id="new")], once_by=("request_id",)) == []
        assert log.append_many([entry(1, request_id="old-7")], once_by=("request_id",)) == []
        assert len(parsed) <= 2, f"parsed {len(parsed)} stored entries"

    def test_once_by_leaves_out_what_the_log_holds_before_taking_its_lock(
        self, stores: Stores, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An event erasure's late ``key.created`` is nearly always held (the capture
        request recorded its key): it must not cost a read under the write lock, which
        every capture's append waits for, of a subject's capture history (one entry per
        capture request). The log is append-only, so a read without the lock may leave
        it out; what is still missing is decided under the lock (decision 0085)."""
        log = stores.audit()
        held = f"{1:064x}"
        log.append_many([entry(1, dek_commitments=[held])])
        under_lock: list[list[str]] = []
        write = type(log)._write

        def recording(
            self: object, prepared: list, once_by: object = (), admitted: object = None
        ) -> object:
            under_lock.append([item.row["action"] for item in prepared])
            return write(self, prepared, once_by, admitted)

        monkeypatch.setattr(type(log), "_write", recording)
        identity = ("request_id", ("dek_commitment", "dek_commitments"))
        late = entry(1, dek_commitments=[held])
        gone = entry(0, request_id="r1", dek_commitment=held)
        assert len(log.append_many([late, gone], once_by=identity)) == 1
        assert under_lock == [["AccessDecision"]]  # the late entry never reached the lock
        assert log.append_many([late, gone], once_by=identity) == []
        assert under_lock == [["AccessDecision"]]
