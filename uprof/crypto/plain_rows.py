"""The one-off upgrade that tags the plaintext event rows written before tags existed.

Until 2026-12-05 the mapper stored plaintext rows (purge signals, quarantine verdicts) as
``0x00 | JSON state``, authenticated by nothing (bug EK). Since then it writes
``0x03 | key id | HMAC tag | JSON state`` (``uprof.crypto.mapper``) and reads a ``0x00``
row as damage. This upgrade re-writes each stored ``0x00`` row with its tag, with the
key store present (it needs the plain-row key, which the KEK unwraps), and then records
itself done in the key folder (``KeyMaterialStore.record_data_upgrade``), after which a
start never runs it again on that deployment: an untagged row written later, by a writer
of the stores without the key folder, stays damage. The record is in the key folder and
not in a key-store table because on PostgreSQL the key tables share the database with the
event log, and whoever can write the one can delete a row of the other.

It runs at start until recorded (``uprof.bootstrap``), and at every restore (the restored
rows are the operator's chosen backup), under the event store's schema lock, before
anything is read. Safe to repeat and to kill: each page of rows is its own transaction,
each row is replaced only if it still holds the bytes read (a compare-and-set), a tagged
row is never touched again, and the record is written only after a full pass. A killed
pass leaves some rows tagged, the rest untagged and nothing recorded; the next start
finishes it.

A re-tagged row may be its stream's head, whose anchor in the key store (decision
0132-stream-head-anchor) holds a digest of the row's stored bytes: each page first moves
those anchors to the tagged bytes (``ProfilesApplication.move_anchors``, a compare-and-set:
only an anchor still naming the untagged row at that version moves), then re-writes the
rows. Killed between the two, the anchor names the tagged bytes and the row is still
untagged: the next start (the upgrade is not recorded) leaves that anchor alone and
re-writes the row to exactly those bytes (the tag is deterministic). A process appending
meanwhile raises an anchor past the row's version: not moved, and not needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import StoredEvent

from uprof.crypto.mapper import PLAIN, PLAIN_TAGGED, PLAIN_TOPICS, tagged_plain_state
from uprof.ports import KeyMaterialStore

#: The upgrade's name in the key folder's record.
UPGRADE = "plain-rows-tagged-1"
#: The key folder's marker of a pass begun and not finished (review of 0136, bug GR).
BEGUN = "plain-rows-tagging-begun-1"
#: Rows read per page (and re-written per transaction).
PAGE = 500


def tag_legacy_plain_rows(
    app: Any,
    keystore: Any,
    material: KeyMaterialStore,
    *,
    again: bool = False,
    page: int = PAGE,
    after_page: Callable[[int], None] | None = None,
) -> int | None:
    """Tag every untagged plaintext row of ``app``'s log; the rows re-written by this
    call, or None when the upgrade was already recorded done (nothing read).

    ``app``: the ``ProfilesApplication``; ``keystore``: its ``KeyStore``; ``material``:
    the key folder that records the upgrade. ``again``: run even if recorded (a restore).
    ``after_page``: called with the rows re-written so far after each page commits
    (tests stop the process there)."""
    if not again and material.data_upgraded(UPGRADE):
        material.forget_data_upgrade(BEGUN)  # a pass killed between its two records
        return None
    table, position = app.backend.events_table(app.recorder)
    select = sa.text(
        f"SELECT {position} AS position, originator_id, originator_version, topic, state "
        f"FROM {table} WHERE {position} > :after AND topic IN :topics "
        f"ORDER BY {position} LIMIT :n"
    ).bindparams(sa.bindparam("topics", expanding=True))
    topics = sorted(PLAIN_TOPICS)
    engine: sa.Engine = app.events_engine

    def pages() -> Iterator[Sequence[Any]]:
        after = 0
        while True:
            with engine.connect() as conn:
                rows = conn.execute(select, {"after": after, "topics": topics, "n": page}).all()
            yield rows
            if len(rows) < page:
                return
            after = int(rows[-1].position)

    if not again and not material.data_upgraded(BEGUN):
        # No pass on record, begun or done. The plain-row key exists only once a first
        # pass has begun (on record just before it creates the key), and a tagged row
        # only once a key existed: either means the upgrade ran and the key folder lost
        # its records since (restored from a copy taken before the upgrade, or the files
        # deleted); with the key's row deleted as well (PostgreSQL: it shares the
        # database with the event log), the tagged rows still tell. The untagged rows
        # are then written after the upgrade, by someone outside uprof: damage, never
        # tagged. Tagging them made a forged row authentic (bug GR).
        if keystore.has_plain_row_key() or any(
            bytes(row.state)[:1] == PLAIN_TAGGED for rows in pages() for row in rows
        ):
            material.record_data_upgrade(UPGRADE)
            return None
    # Begun on record before the key is created: a pass killed after that is resumed.
    material.record_data_upgrade(BEGUN)
    key_id, key = keystore.current_plain_row_key()
    update = sa.text(
        f"UPDATE {table} SET state = :new "
        "WHERE originator_id = :s AND originator_version = :v AND state = :old"
    )
    rewritten = 0
    for rows in pages():
        rewrites = [
            (
                StoredEvent(row.originator_id, int(row.originator_version), str(row.topic), state),
                tagged_plain_state(
                    key,
                    key_id,
                    UUID(str(row.originator_id)),
                    int(row.originator_version),
                    str(row.topic),
                    state[1:],
                ),
            )
            for row in rows
            # Tagged already, or not a plaintext row: the mapper decides.
            if (state := bytes(row.state))[:1] == PLAIN
        ]
        if rewrites:
            # The anchors first (decision 0132): a re-tagged row that is its stream's
            # anchored head changes the bytes the anchor's digest names. Killed after this,
            # before the rows below commit, the next run finds the rows still untagged and
            # their anchors already moved (left alone), and re-writes them.
            app.move_anchors(rewrites)
            # Flushed before the next page, and so before the record below: a row whose
            # re-write a power cut lost would be an untagged row after the record (bug FR).
            with app.backend.flushed_transaction(engine) as conn:
                for old, new in rewrites:
                    done = conn.execute(
                        update,
                        {
                            "new": new,
                            "s": old.originator_id,
                            "v": old.originator_version,
                            "old": old.state,
                        },
                    )
                    rewritten += done.rowcount
        if rows and after_page is not None:
            after_page(rewritten)
    material.record_data_upgrade(UPGRADE)
    # Then the pass is no longer in progress: a start that finds the record above gone
    # (and this marker gone) does not tag what the stores hold then (bug GR).
    material.forget_data_upgrade(BEGUN)
    return rewritten
