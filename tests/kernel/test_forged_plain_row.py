"""An event-store writer who forges a *plaintext* row in a narrowing event's place
(review of 0126, both backends, each start its own kernel as a process would be).

The mapper reads three topics in plaintext (the purge signals and the pipeline's
``DamagedEventQuarantined`` verdict, decision 0124): no subject key is needed to write
one. 0126 (bug EB) made a consent withdrawal whose *marker* or *key version* is altered
read as damage, not as shredding, so the withdrawal cannot be dropped from the loaded
profile that way. The same writer could instead overwrite the withdrawal's row, at its
version, with a well-formed plaintext row that applies nothing (bug EK: on main at
314c138 and at 4b78f56 the next process served the app again, 4 of 4, both backends), or
delete it when it is the stream's last row (bug EL: 2 of 2, both backends). EL is fixed
by the key store's anchor of each stream's head (decision 0132-stream-head-anchor): a cut
tail, or any row replaced at the head, is damage. EK is fixed below the head too:
plaintext rows carry an HMAC tag under a deployment key in the key store (decision
0136-authenticated-plaintext-rows); a forged, guessed or moved one is damage. So that each
EK test tests the tag and not the anchor, its forged row sits below the stream's head (a
later event is appended first). The ``test_held_*`` ones are attacks that failed closed
before."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa
from eventsourcing.persistence import Mapper
from eventsourcing.utils import get_topic

from domain.errors import StoredDataDamagedError
from domain.profile import SubjectProfile
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.stored_rows import rewrite_row, stored_rows
from uprof.crypto.mapper import DamagedEventError
from uprof.kernel import Uprof

CATS, PURPOSE = ["preferences"], "personalization"


def _version_of(k: Uprof, stream: UUID, topic: str) -> int:
    return next(v for v, t, _ in stored_rows(k, stream) if t.endswith(topic))


def _withdrawn(backend: Backend, clock: FakeClock) -> tuple[UUID, int]:
    """alice granted and withdrew; the withdrawal's stream and version."""
    with running(settings_for(backend), clock) as k:
        k.withdraw_consent("alice", consent(k, "alice"))
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        stream = k.stream_of("alice")
        return stream, _version_of(k, stream, ".ConsentWithdrawn")


def _below_the_head(k: Uprof) -> None:
    """A later row in alice's stream (a grant for another app), so the row a test forges
    is not the stream's head: a head row replaced is caught by the stream's anchor (bug EL,
    decision 0132), a row below it only by its own authentication (AEAD or tag), which is
    what these tests test."""
    consent(k, "alice", app="app:calendar")


def _plain_event(stream: UUID, version: int, kind: str) -> Any:
    """A plaintext event that applies nothing to consents."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    common = {"originator_id": stream, "originator_version": version, "timestamp": now}
    if kind == "verdict":
        return SubjectProfile.DamagedEventQuarantined(
            **common, notification_id=1, damaged_version=1, quarantined_at=now
        )
    return SubjectProfile.CaptureErased(  # type: ignore[call-arg]
        **common, capture_id="0" * 32, erased_at=now
    )


def _forged(
    k: Uprof, stream: UUID, version: int, kind: str, form: str = "untagged"
) -> tuple[str, bytes]:
    """A plaintext row anyone can build from the code alone (no key): the format of
    before the tags (``0x00 | JSON``), or the tagged one with a tag guessed under key 1."""
    # The library's own mapping (what the code alone does), without uprof's mapper.
    stored = Mapper.to_stored_event(k.app.mapper, _plain_event(stream, version, kind))
    topic, body = stored.topic, stored.state
    if form == "untagged":
        return topic, b"\x00" + body
    return topic, b"\x03" + (1).to_bytes(4, "big") + secrets.token_bytes(32) + body


@pytest.mark.parametrize("form", ["untagged", "guessed-tag"])
@pytest.mark.parametrize("kind", ["verdict", "capture-tombstone"])
def test_a_withdrawal_overwritten_by_a_forged_plaintext_row(
    backend: Backend, clock: FakeClock, kind: str, form: str
) -> None:
    """alice's ``ConsentWithdrawn`` row overwritten, at its version, by a plaintext
    ``DamagedEventQuarantined`` or ``CaptureErased`` (of no capture) built without any
    key: the next process must not serve the app as if the consent were in force.
    On main at 4b78f56 it did (bug EK); now the row is not authenticated: damage."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        _below_the_head(k)
        rewrite_row(k, stream, version, *_forged(k, stream, version, kind, form))
    with running(settings_for(backend), clock) as k:
        with pytest.raises(StoredDataDamagedError, match="not authenticated"):
            k.unconsented("alice", APP, CATS, PURPOSE)


def test_held_a_withdrawal_relabelled_as_a_grant(backend: Backend, clock: FakeClock) -> None:
    """Held: the topic column changed to ``ConsentGranted`` (or any sealed topic); the
    associated data names the topic, so the row fails authentication: damaged."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        _below_the_head(k)
        state = next(s for v, _, s in stored_rows(k, stream) if v == version)
        granted = next(t for _, t, _ in stored_rows(k, stream) if t.endswith(".ConsentGranted"))
        rewrite_row(k, stream, version, granted, state)
    with running(settings_for(backend), clock) as k:
        with pytest.raises(DamagedEventError):
            k.unconsented("alice", APP, CATS, PURPOSE)


def test_held_rows_swapped_or_replayed_at_another_version(
    backend: Backend, clock: FakeClock
) -> None:
    """Held: the withdrawal and the grant before it swapped (topics and states), and the
    withdrawal's row replayed over a later row: the associated data names the version,
    so each moved row fails authentication and the stream does not load."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.withdraw_consent("alice", consent(k, "alice"))  # a later row to replay over
        rows = {v: (t, s) for v, t, s in stored_rows(k, stream)}
        grant = max(v for v, (t, _) in rows.items() if v < version and t.endswith("Granted"))
        rewrite_row(k, stream, version, *rows[grant])
        rewrite_row(k, stream, grant, *rows[version])
    with running(settings_for(backend), clock) as k:
        with pytest.raises(DamagedEventError):
            k.unconsented("alice", APP, CATS, PURPOSE)
    with running(settings_for(backend), clock) as k:
        rewrite_row(k, stream, grant, *rows[grant])
        rewrite_row(k, stream, version, *rows[version])
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS  # restored: opens
        last = max(rows)
        _below_the_head(k)  # the last row read above no longer the head
        rewrite_row(k, stream, last, *rows[version])
    with running(settings_for(backend), clock) as k:
        with pytest.raises(DamagedEventError):
            k.unconsented("alice", APP, CATS, PURPOSE)


def test_a_withdrawal_deleted_between_rows_is_named_damage(
    backend: Backend, clock: FakeClock
) -> None:
    """The withdrawal's row deleted while a later row follows it leaves a gap in the
    versions; the stream does not load (the library checks each event is the next), so
    the consent checks fail closed. On main at 314c138 they failed with the library's
    ``OriginatorVersionError``, which no surface names (an anonymous internal error, as
    BZ was): now it is ``stored_data_damaged`` like any other damaged row (bug EM)."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.withdraw_consent("alice", consent(k, "alice"))
        _delete(k, stream, version)
    with running(settings_for(backend), clock) as k:
        with pytest.raises(StoredDataDamagedError, match="not in sequence"):
            k.unconsented("alice", APP, CATS, PURPOSE)
        with pytest.raises(StoredDataDamagedError):
            k.slice(
                "alice",
                "anything",
                budget_tokens=200,
                purpose=PURPOSE,
                app_id=APP,
                agent_id="coach",
            )


@pytest.mark.parametrize("form", ["untagged", "with-the-key"])
def test_held_a_forged_verdict_beside_a_withdrawal_decides_nothing(
    backend: Backend, clock: FakeClock, form: str
) -> None:
    """Held for access: a ``DamagedEventQuarantined`` appended at the stream's next
    version, naming the withdrawal's log position. Written without the key (``untagged``)
    it is damage since EK's fix: the stream does not load, the app is refused. Tagged
    with the deployment's key (what only uprof itself can write) it is a verdict the
    pipeline's fold reads, but the loaded profile still applies the withdrawal (the
    verdict applies nothing): the app is refused in a fresh process."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        app = k.app
        table = app.recorder.events_table_name  # type: ignore[attr-defined]
        key = app.backend.stream_key(stream)
        position = "rowid" if backend.kind == "sqlite" else "notification_id"
        with app.events_engine.connect() as conn:
            nid = conn.execute(
                sa.text(
                    f"SELECT {position} FROM {table} "
                    "WHERE originator_id = :s AND originator_version = :v"
                ),
                {"s": key, "v": version},
            ).scalar_one()
        head = max(v for v, _, _ in stored_rows(k, stream))
        now = datetime(2026, 1, 1, tzinfo=UTC)
        verdict = SubjectProfile.DamagedEventQuarantined(
            originator_id=stream,
            originator_version=head + 1,
            timestamp=now,
            notification_id=int(nid),
            damaged_version=version,
            quarantined_at=now,
        )
        if form == "untagged":
            plain = Mapper.to_stored_event(app.mapper, verdict)  # the code alone, no key
            topic, state = plain.topic, b"\x00" + plain.state
        else:
            tagged = app.mapper.to_stored_event(verdict)
            topic, state = tagged.topic, tagged.state
        with app.events_engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
                    "VALUES (:s, :v, :t, :st)"
                ),
                {"s": key, "v": head + 1, "t": topic, "st": state},
            )
    with running(settings_for(backend), clock) as k:
        if form == "untagged":
            with pytest.raises(StoredDataDamagedError, match="not authenticated"):
                k.unconsented("alice", APP, CATS, PURPOSE)
            return
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        assert k.consents_in_force("alice") == []


def _delete(k: Uprof, stream: UUID, version: int) -> None:
    app = k.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    with app.events_engine.begin() as conn:
        conn.execute(
            sa.text(f"DELETE FROM {table} WHERE originator_id = :s AND originator_version = :v"),
            {"s": app.backend.stream_key(stream), "v": version},
        )


def test_a_withdrawal_cut_from_the_stream_tail(backend: Backend, clock: FakeClock) -> None:
    """The withdrawal as the stream's last row, deleted: no gap is left, and nothing a
    row carries can tell a stream cut short from one that never went on. The stream's
    anchor in the key store can (bug EL): the next process refuses alice's consent
    checks and slices as damage. On main at 4b78f56 it served the app again."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        assert max(v for v, _, _ in stored_rows(k, stream)) == version
        _delete(k, stream, version)
    with running(settings_for(backend), clock) as k:
        with pytest.raises(StoredDataDamagedError, match="end before"):
            k.unconsented("alice", APP, CATS, PURPOSE)
        with pytest.raises(StoredDataDamagedError):
            k.slice(
                "alice",
                "anything",
                budget_tokens=200,
                purpose=PURPOSE,
                app_id=APP,
                agent_id="coach",
            )
        with pytest.raises(StoredDataDamagedError):
            k.consents_in_force("alice")


@pytest.mark.parametrize("kind", ["verdict", "capture-tombstone"])
def test_held_a_withdrawal_relabelled_as_a_plaintext_topic(
    backend: Backend, clock: FakeClock, kind: str
) -> None:
    """Held: only the topic column changed to a plaintext topic (the sealed state kept):
    a plaintext topic not in its plaintext format is refused as a damaged purge signal
    (0126, bug EA), never read as shredded while the subject has keys: consent checks
    fail closed in a fresh process."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        _below_the_head(k)
        topic, _ = _forged(k, stream, version, kind)
        state = next(s for v, _, s in stored_rows(k, stream) if v == version)
        rewrite_row(k, stream, version, topic, state)
    with running(settings_for(backend), clock) as k:
        with pytest.raises(StoredDataDamagedError):
            k.unconsented("alice", APP, CATS, PURPOSE)


@pytest.mark.parametrize("moved", ["stream", "version", "topic", "nowhere"])
def test_a_tagged_plain_row_moved_from_another_place_is_damage(
    backend: Backend, clock: FakeClock, moved: str
) -> None:
    """A genuine tagged plaintext row (made by the mapper, with the deployment's key) for
    another stream, another version or another topic, written over alice's withdrawal:
    the tag binds the row's place, so it does not verify there: damaged in a fresh
    process. ``nowhere``: one made for this very place verifies and applies nothing (the
    consent is back in force: below the head, no anchor sees it), which is why the key
    stays in the key store."""
    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        _below_the_head(k)
        made_for = {
            "stream": (uuid4(), version, "verdict"),
            "version": (stream, version + 7, "verdict"),
            "topic": (stream, version, "capture-tombstone"),
            "nowhere": (stream, version, "verdict"),
        }[moved]
        stored = k.app.mapper.to_stored_event(_plain_event(*made_for))
        assert stored.state[:1] == b"\x03"  # tagged
        verdict = get_topic(SubjectProfile.DamagedEventQuarantined)
        rewrite_row(k, stream, version, verdict, stored.state)
    with running(settings_for(backend), clock) as k:
        if moved == "nowhere":
            assert k.unconsented("alice", APP, CATS, PURPOSE) == []
            return
        with pytest.raises(StoredDataDamagedError, match="not authenticated"):
            k.unconsented("alice", APP, CATS, PURPOSE)


def test_held_an_untagged_row_with_the_plain_row_keys_deleted_is_not_tagged_by_a_start(
    backend: Backend, clock: FakeClock
) -> None:
    """On PostgreSQL the key tables share the database with the event log, so the writer
    may delete the plain-row keys too, hoping the next start re-tags their untagged row
    under a new key. The upgrade's record is in the key folder, which they lack: no start
    tags it, and the consent checks fail closed (the genuine rows' key is gone as well)."""
    from uprof.crypto.tables import plain_row_keys

    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        _below_the_head(k)
        rewrite_row(k, stream, version, *_forged(k, stream, version, "verdict"))
        with k.keys_engine.begin() as conn:
            assert conn.execute(plain_row_keys.delete()).rowcount >= 1
    for _ in range(2):  # a start, and the start after it
        with running(settings_for(backend), clock) as k:
            assert next(s for v, _, s in stored_rows(k, stream) if v == version)[:1] == b"\x00"
            with pytest.raises(StoredDataDamagedError, match="not authenticated"):
                k.unconsented("alice", APP, CATS, PURPOSE)


ERASED = "I met Qzxerasedcanary at the market"


def _nid(k: Uprof, stream: UUID, version: int) -> int:
    app = k.app
    table, position = app.backend.events_table(app.recorder)
    with app.events_engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    f"SELECT {position} FROM {table} "
                    "WHERE originator_id = :s AND originator_version = :v"
                ),
                {"s": app.backend.stream_key(stream), "v": version},
            ).scalar_one()
        )


def _served(k: Uprof, subject: str) -> list[str]:
    """The memories a profile read serves (none when the read fails closed)."""
    try:
        return sorted(m.text for m in k.profile(subject).memories)
    except StoredDataDamagedError:
        return []


def test_a_forged_verdict_naming_an_item_erasure_does_not_undo_it_on_rebuild(
    backend: Backend, clock: FakeClock
) -> None:
    """A keyless ``DamagedEventQuarantined`` appended to alice's stream, naming the log
    position of her ``ItemsErased``: the projections pass over every position a verdict
    names, so on main at 4b78f56 the next rebuild passed over the erasure and alice's
    profile served the erased memory again (bug FM). Now the verdict is not authenticated:
    the rebuild stops at it (fail closed) and nothing erased is served."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        k.capture_many("alice", [say(ERASED, ref="a-1")])
        k.process()
        [item] = [m for m in k.profile("alice").memories if m.text == ERASED]
        k.erase_item("alice", item.item_id)
        assert ERASED not in _served(k, "alice")
        stream = k.stream_of("alice")
        erased_at = _version_of(k, stream, ".ItemsErased")
        head = max(v for v, _, _ in stored_rows(k, stream))
        now = datetime(2026, 1, 1, tzinfo=UTC)
        verdict = SubjectProfile.DamagedEventQuarantined(
            originator_id=stream,
            originator_version=head + 1,
            timestamp=now,
            notification_id=_nid(k, stream, erased_at),
            damaged_version=erased_at,
            quarantined_at=now,
        )
        plain = Mapper.to_stored_event(k.app.mapper, verdict)  # the code alone, no key
        table = k.app.recorder.events_table_name  # type: ignore[attr-defined]
        with k.app.events_engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
                    "VALUES (:s, :v, :t, :st)"
                ),
                {
                    "s": k.app.backend.stream_key(stream),
                    "v": head + 1,
                    "t": plain.topic,
                    "st": b"\x00" + plain.state,
                },
            )
    with running(settings_for(backend), clock) as k:
        try:
            k.rebuild()
        except StoredDataDamagedError:
            pass  # fail closed
        assert ERASED not in _served(k, "alice"), "erased memory served again"


KEPT = "I met Qzxkeptcanary at the park"


@pytest.mark.parametrize("form", ["marker-flipped", "untagged"])
def test_a_verdict_that_is_not_authentic_is_set_aside_and_stops_no_start(
    backend: Backend, clock: FakeClock, form: str
) -> None:
    """A ``DamagedEventQuarantined`` row that does not open (its plaintext marker flipped:
    storage damage; or written without the key) at alice's next version, in a deployment
    whose erasure ledger names an erased item (so every start projects to the head).
    On main at 4b78f56 the marker-flipped one made every start fail (the quarantine index
    decodes every verdict, and re-applying the ledger projects): no process of the
    deployment came up, not even to erase alice (bug FN). Now a verdict that is not
    authentic is damage the pipeline sets aside (a verdict applies nothing), the index
    does not honour it, bob is served, alice's stream fails closed."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.capture_many("alice", [say(ERASED, ref="a-1")])
        k.process()
        [item] = [m for m in k.profile("alice").memories if m.text == ERASED]
        k.erase_item("alice", item.item_id)
        stream = k.stream_of("alice")
        head = max(v for v, _, _ in stored_rows(k, stream))
        now = datetime(2026, 1, 1, tzinfo=UTC)
        verdict = SubjectProfile.DamagedEventQuarantined(
            originator_id=stream,
            originator_version=head + 1,
            timestamp=now,
            notification_id=1,
            damaged_version=1,
            quarantined_at=now,
        )
        plain = Mapper.to_stored_event(k.app.mapper, verdict)
        state = (b"\x01" if form == "marker-flipped" else b"\x00") + plain.state
        table = k.app.recorder.events_table_name  # type: ignore[attr-defined]
        with k.app.events_engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
                    "VALUES (:s, :v, :t, :st)"
                ),
                {
                    "s": k.app.backend.stream_key(stream),
                    "v": head + 1,
                    "t": plain.topic,
                    "st": state,
                },
            )
    with running(settings_for(backend), clock) as k:  # the deployment starts
        k.capture_many("bob", [say(KEPT, ref="b-1")])
        k.process()
        assert KEPT in _served(k, "bob")
        assert [q.stage for q in k.quarantined()] == ["damaged"]
        with pytest.raises(StoredDataDamagedError):
            k.unconsented("alice", APP, CATS, PURPOSE)


@pytest.mark.parametrize("keys", ["kept", "deleted"])
@pytest.mark.parametrize("kind", ["verdict", "capture-tombstone"])
def test_an_untagged_row_forged_after_the_upgrade_is_not_tagged_when_its_record_is_lost(
    backend: Backend, clock: FakeClock, kind: str, keys: str
) -> None:
    """Review of 0136 (bug GR). After the upgrade, an event-store writer overwrites the
    withdrawal (below the head) with an untagged plaintext row; later the key folder loses
    the upgrade's record (restored from a copy taken before the upgrade, or the file
    deleted). The next start must not take the forged row for a legacy one and tag it:
    a deployment that already holds its plain-row key has run the upgrade, and only a
    pass begun on record and not finished is resumed. With the plain-row keys' rows
    deleted too (``keys="deleted"``: on PostgreSQL they share the event log's database),
    the log's genuine tagged rows (bob's erasure) still show the upgrade ran. On main at
    66aa5cb the start tagged the forged row and served the app again."""
    from uprof.crypto.keydir import UPGRADE_FILE_PREFIX
    from uprof.crypto.plain_rows import UPGRADE
    from uprof.crypto.tables import plain_row_keys

    stream, version = _withdrawn(backend, clock)
    with running(settings_for(backend), clock) as k:
        consent(k, "bob")
        k.erase_subject("bob")  # a genuine tagged row elsewhere in the log
        _below_the_head(k)
        rewrite_row(k, stream, version, *_forged(k, stream, version, kind))
        (k.settings.key_path / f"{UPGRADE_FILE_PREFIX}{UPGRADE}").unlink()
        if keys == "deleted":
            with k.keys_engine.begin() as conn:
                assert conn.execute(plain_row_keys.delete()).rowcount >= 1
    for _ in range(2):  # a start, and the start after it
        with running(settings_for(backend), clock) as k:
            assert next(s for v, _, s in stored_rows(k, stream) if v == version)[:1] == b"\x00"
            with pytest.raises(StoredDataDamagedError, match="not authenticated"):
                k.unconsented("alice", APP, CATS, PURPOSE)


@pytest.mark.parametrize("form", ["unknown-key-id", "key-id-zero", "truncated-tag", "no-tag"])
def test_held_a_genuine_tagged_row_with_its_key_id_or_tag_altered(
    backend: Backend, clock: FakeClock, form: str
) -> None:
    """Held (review of 0136): alice's genuine tagged ``CaptureErased`` row (below her
    head) with its key id changed to one the key store lacks (or 0), its tag cut short by
    one byte, or its tag removed. None reads as a legacy row or as a row of another key:
    each is damage at load, and the starts after leave it as it is (the upgrade touches
    only ``0x00`` rows)."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        ack = k.capture("alice", say("I like tea"))
        k.process_to_log_end()
        k.erase_capture("alice", ack.capture_id)
        _below_the_head(k)
        stream = k.stream_of("alice")
        version = _version_of(k, stream, ".CaptureErased")
        topic, state = next((t, s) for v, t, s in stored_rows(k, stream) if v == version)
        assert state[:1] == b"\x03"
        key_id, tag, body = state[1:5], state[5:37], state[37:]
        altered = {
            "unknown-key-id": b"\x03" + (int.from_bytes(key_id, "big") + 6).to_bytes(4, "big"),
            "key-id-zero": b"\x03" + (0).to_bytes(4, "big"),
        }.get(form, b"\x03" + key_id)
        if form in ("unknown-key-id", "key-id-zero"):
            altered += tag + body
        elif form == "truncated-tag":
            altered += tag[:31] + body
        else:
            altered += body
        rewrite_row(k, stream, version, topic, altered)
    for _ in range(2):
        with running(settings_for(backend), clock) as k:
            assert next(s for v, _, s in stored_rows(k, stream) if v == version) == altered
            with pytest.raises(StoredDataDamagedError, match="not authenticated"):
                k.profile("alice")
