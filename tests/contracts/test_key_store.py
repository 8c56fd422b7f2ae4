"""SubjectKeyStore contract: the in-memory fake, SQLite and PostgreSQL behave alike."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from domain.errors import SubjectErasedError
from tests.contracts.conftest import Stores
from uprof.crypto.keystore import StreamHead

TENANT = "default"
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class KeyStoreContract:
    """What every KeyStore must do (bound to a flavour by the classes at the end)."""

    def test_a_subject_is_created_once_then_resolved(self, stores: Stores) -> None:
        keys = stores.keys()
        assert keys.resolve(TENANT, "alice") is None
        created = keys.resolve_or_create(TENANT, "alice", now=NOW)
        assert created.created and created.pseudonym.startswith("subj_")
        again = keys.resolve_or_create(TENANT, "alice", now=NOW)
        assert (again.stream_id, again.pseudonym, again.created) == (
            created.stream_id,
            created.pseudonym,
            False,
        )
        found = keys.resolve(TENANT, "alice")
        assert found is not None and found.stream_id == created.stream_id
        assert keys.resolve("other-tenant", "alice") is None
        assert keys.stream_ids(TENANT) == [created.stream_id]
        assert keys.pseudonym(TENANT, "alice") == created.pseudonym

    def test_unknown_references_get_a_fresh_pseudonym_each_time(self, stores: Stores) -> None:
        keys = stores.keys()
        assert keys.pseudonym(TENANT, "nobody") != keys.pseudonym(TENANT, "nobody")

    def test_resolve_many_leaves_out_unknown_references(self, stores: Stores) -> None:
        keys = stores.keys()
        a = keys.resolve_or_create(TENANT, "a", now=NOW)
        b = keys.resolve_or_create(TENANT, "b", now=NOW)
        found = keys.resolve_many(TENANT, ["a", "b", "c"])
        assert {ref: h.stream_id for ref, h in found.items()} == {
            "a": a.stream_id,
            "b": b.stream_id,
        }

    def test_an_alias_resolves_to_its_subject_and_rebinding_replaces_it(
        self, stores: Stores
    ) -> None:
        keys = stores.keys()
        a = keys.resolve_or_create(TENANT, "a", now=NOW)
        b = keys.resolve_or_create(TENANT, "b", now=NOW)
        keys.bind_alias(TENANT, "session", "s1", a.stream_id, now=NOW)
        found = keys.resolve_alias(TENANT, "session", "s1")
        assert found is not None and found.stream_id == a.stream_id
        keys.bind_alias(TENANT, "session", "s1", b.stream_id, now=NOW)
        found = keys.resolve_alias(TENANT, "session", "s1")
        assert found is not None and found.stream_id == b.stream_id
        assert keys.resolve_alias(TENANT, "identifier", "s1") is None

    def test_binding_to_an_erased_stream_binds_nothing(self, stores: Stores) -> None:
        # The caller found the subject live; another process erased it before the
        # binding was stored (bug DK): nothing may point at the shredded stream.
        keys = stores.keys()
        a = keys.resolve_or_create(TENANT, "a", now=NOW)
        b = keys.resolve_or_create(TENANT, "b", now=NOW)
        assert keys.bind_alias(TENANT, "session", "s1", b.stream_id, now=NOW)
        keys.destroy(str(a.stream_id), now=NOW)
        assert not keys.bind_alias(TENANT, "session", "s2", a.stream_id, now=NOW)
        assert keys.resolve_alias(TENANT, "session", "s2") is None
        # A rebinding to it neither binds nor drops the live binding it would replace.
        assert not keys.bind_alias(TENANT, "session", "s1", a.stream_id, now=NOW)
        found = keys.resolve_alias(TENANT, "session", "s1")
        assert found is not None and found.stream_id == b.stream_id
        # Nor to another tenant's stream.
        assert not keys.bind_alias("other", "session", "s3", b.stream_id, now=NOW)
        assert keys.destruction_preview(str(a.stream_id)).aliases == 0

    def test_a_subject_has_a_current_data_key_and_a_view_key(self, stores: Stores) -> None:
        keys = stores.keys()
        stream = str(keys.resolve_or_create(TENANT, "a", now=NOW).stream_id)
        version, dek = keys.current_key(stream)
        assert version == 1 and len(dek) == 32
        assert keys.key(stream, 1) == dek
        assert keys.key(stream, 2) is None
        view = keys.view_key(stream)
        assert view is not None and len(view) == 64

    def test_capture_keys_are_per_capture_and_one_can_be_destroyed(self, stores: Stores) -> None:
        keys = stores.keys()
        stream = str(keys.resolve_or_create(TENANT, "a", now=NOW).stream_id)
        keys.create_capture_keys(stream, ["c1" * 16, "c2" * 16], now=NOW)
        first, second = keys.capture_key(stream, "c1" * 16), keys.capture_key(stream, "c2" * 16)
        assert first is not None and second is not None and first != second
        assert keys.capture_key(stream, "c3" * 16) is None
        preview = keys.capture_key_commitment(stream, "c1" * 16)
        assert keys.capture_key(stream, "c1" * 16) == first  # the preview deletes nothing
        commitment = keys.destroy_capture_key(stream, "c1" * 16)
        assert commitment is not None and len(commitment) == 64
        assert preview == commitment
        assert keys.capture_key_commitment(stream, "c1" * 16) is None
        assert keys.capture_key(stream, "c1" * 16) is None
        assert keys.capture_key(stream, "c2" * 16) == second
        assert keys.destroy_capture_key(stream, "c1" * 16) is None

    def test_destroying_a_subject_erases_every_key_alias_and_index_row(
        self, stores: Stores
    ) -> None:
        keys = stores.keys()
        handle = keys.resolve_or_create(TENANT, "a", now=NOW)
        other = keys.resolve_or_create(TENANT, "b", now=NOW)
        stream = str(handle.stream_id)
        keys.create_capture_keys_many(
            {stream: ["c1" * 16], str(other.stream_id): ["c9" * 16]}, now=NOW
        )
        keys.bind_alias(TENANT, "session", "s1", handle.stream_id, now=NOW)
        assert not keys.is_shredded(stream)
        preview = keys.destruction_preview(stream)
        assert not keys.is_shredded(stream) and keys.key(stream, 1) is not None

        destruction = keys.destroy(stream, now=NOW)

        assert preview == destruction  # what the receipt's draft cites before the keys go

        assert [d.key_version for d in destruction.deks] == [1]
        assert len(destruction.deks[0].dek_commitment) == 64
        assert (destruction.capture_keys, destruction.aliases) == (1, 1)
        assert keys.is_shredded(stream)
        assert keys.shredded_among([stream, str(other.stream_id)]) == {stream}
        assert keys.key(stream, 1) is None
        assert keys.view_key(stream) is None
        assert keys.capture_key(stream, "c1" * 16) is None
        with pytest.raises(SubjectErasedError):
            keys.current_key(stream)
        with pytest.raises(SubjectErasedError):
            keys.create_capture_keys(stream, ["c2" * 16], now=NOW)
        assert keys.resolve(TENANT, "a") is None
        assert keys.resolve_alias(TENANT, "session", "s1") is None
        assert keys.stream_ids(TENANT) == [other.stream_id]
        # The other subject keeps everything.
        assert keys.capture_key(str(other.stream_id), "c9" * 16) is not None
        # The same reference later names a new, unlinked subject.
        again = keys.resolve_or_create(TENANT, "a", now=NOW)
        assert again.created and again.stream_id != handle.stream_id
        assert again.pseudonym != handle.pseudonym

    def test_a_stream_anchor_only_rises_and_goes_with_the_keys(self, stores: Stores) -> None:
        keys = stores.keys()
        log, copy = "log-1", "log-2"
        a = str(keys.resolve_or_create(TENANT, "a", now=NOW).stream_id)
        b = str(keys.resolve_or_create(TENANT, "b", now=NOW).stream_id)
        assert keys.stream_head(log, a) is None  # unknown until a head is anchored
        keys.raise_stream_heads(log, [StreamHead(a, 5, "5" * 64), StreamHead(b, 2, "2" * 64)])
        keys.raise_stream_heads(log, [StreamHead(a, 3, "3" * 64)])  # a late writer lowers nothing
        keys.raise_stream_heads(log, [StreamHead(a, 5, "x" * 64)])  # nor replaces its digest
        assert keys.stream_head(log, a) == StreamHead(a, 5, "5" * 64)
        # Raised only over the anchor its writer checked (bug GM): not over none, another
        # version or another digest.
        for over in ((0, ""), (4, "4" * 64), (5, "x" * 64)):
            keys.raise_stream_heads(log, [StreamHead(a, 7, "7" * 64, *over)])
        assert keys.stream_head(log, a) == StreamHead(a, 5, "5" * 64)
        keys.raise_stream_heads(log, [StreamHead(a, 6, "6" * 64, 5, "5" * 64)])
        assert keys.stream_head(log, a) == StreamHead(a, 6, "6" * 64)
        assert keys.stream_heads_of(log, [a, b, c_unknown := "0" * 36]) == {
            a: StreamHead(a, 6, "6" * 64),
            b: StreamHead(b, 2, "2" * 64),
        }
        assert c_unknown not in keys.stream_heads_of(log, [c_unknown])
        assert keys.stream_head(copy, a) is None  # another log (a copy elsewhere) is its own
        keys.raise_stream_heads(copy, [StreamHead(a, 2, "2" * 64)])
        assert keys.stream_head(log, a) == StreamHead(a, 6, "6" * 64)
        keys.destroy(a, now=NOW)
        assert keys.stream_head(log, a) is None and keys.stream_head(copy, a) is None
        keys.raise_stream_heads(log, [StreamHead(a, 7, "7" * 64)])  # after the erasure: none
        assert keys.stream_head(log, a) is None
        # A restore's heads replace every anchor, lower ones included; none for a
        # shredded stream; another log's go too (bug GN: a restored folder moved to another
        # log's path takes its identity).
        c = str(keys.resolve_or_create(TENANT, "c", now=NOW).stream_id)
        keys.raise_stream_heads(copy, [StreamHead(b, 9, "9" * 64)])
        written = keys.replace_stream_heads(
            log, [StreamHead(a, 1, "1" * 64), StreamHead(b, 1, "1" * 64)]
        )
        assert written == 1
        assert keys.stream_head(log, b) == StreamHead(b, 1, "1" * 64)
        assert keys.stream_head(log, a) is None and keys.stream_head(log, c) is None
        assert keys.stream_head(copy, b) is None

    def test_a_stream_anchor_moves_to_a_new_digest_only_from_the_one_it_holds(
        self, stores: Stores
    ) -> None:
        """The plain-row upgrade's compare-and-set: an anchor moves to a re-written head
        row's digest only while it still names that row's old bytes at that version."""
        keys = stores.keys()
        log = "log-1"
        a = str(keys.resolve_or_create(TENANT, "a", now=NOW).stream_id)
        b = str(keys.resolve_or_create(TENANT, "b", now=NOW).stream_id)
        keys.raise_stream_heads(log, [StreamHead(a, 5, "o" * 64), StreamHead(b, 7, "p" * 64)])
        assert keys.move_stream_heads(log, []) == 0
        moved = keys.move_stream_heads(
            log,
            [
                (StreamHead(a, 5, "o" * 64), "n" * 64),  # holds the old digest: moves
                (StreamHead(b, 6, "p" * 64), "q" * 64),  # raised past that version: stays
            ],
        )
        assert moved == 1
        assert keys.stream_head(log, a) == StreamHead(a, 5, "n" * 64)
        assert keys.stream_head(log, b) == StreamHead(b, 7, "p" * 64)
        # Again (a re-run after a kill): already moved, nothing to do.
        assert keys.move_stream_heads(log, [(StreamHead(a, 5, "o" * 64), "n" * 64)]) == 0
        # Another digest than the old one (a head replaced by someone): left alone.
        assert keys.move_stream_heads(log, [(StreamHead(b, 7, "z" * 64), "q" * 64)]) == 0
        assert keys.stream_head(log, b) == StreamHead(b, 7, "p" * 64)
        assert keys.move_stream_heads("log-2", [(StreamHead(b, 7, "p" * 64), "q" * 64)]) == 0


class TestKeyStoreInMemory(KeyStoreContract):
    @pytest.fixture
    def stores(self, memory_stores: Stores) -> Stores:
        return memory_stores


class TestKeyStoreOnDatabase(KeyStoreContract):
    @pytest.fixture
    def stores(self, database_stores: Stores) -> Stores:
        return database_stores
