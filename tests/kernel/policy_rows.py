"""Reading and rewriting the policy store's stored rows directly, as a writer of the
stores (without the key folder) would: one place for the SQL the policy-seal tests need."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from eventsourcing.persistence import Mapper

from domain.policy import TenantPolicy, policy_id
from tests.conftest import Backend
from uprof.settings import Settings

POLICY_FILE = "policies.sqlite"


def policy_engine(backend: Backend, settings: Settings) -> tuple[sa.Engine, str, str]:
    """(engine, events table, snapshots table) of the policy store."""
    if backend.kind == "sqlite":
        path = Path(settings.data_dir) / POLICY_FILE
        return sa.create_engine(f"sqlite:///{path}"), "stored_events", "stored_snapshots"
    return sa.create_engine(backend.url), "policies_events", "policies_snapshots"


def _key(backend: Backend, tenant: str) -> str:
    pid = policy_id(tenant)
    return pid.hex if backend.kind == "sqlite" else str(pid)


def policy_rows(backend: Backend, settings: Settings) -> list[tuple[int, str, bytes]]:
    """``(version, topic, state)`` of every row of the tenant's policy stream."""
    engine, table, _ = policy_engine(backend, settings)
    try:
        with engine.connect() as conn:
            return [
                (int(r[0]), str(r[1]), bytes(r[2]))
                for r in conn.execute(
                    sa.text(
                        f"SELECT originator_version, topic, state FROM {table} "
                        "WHERE originator_id = :s ORDER BY originator_version"
                    ),
                    {"s": _key(backend, settings.tenant)},
                )
            ]
    finally:
        engine.dispose()


def insert_policy_row(
    backend: Backend, settings: Settings, version: int, topic: str, state: bytes
) -> None:
    engine, table, _ = policy_engine(backend, settings)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
                    "VALUES (:s, :v, :t, :st)"
                ),
                {"s": _key(backend, settings.tenant), "v": version, "t": topic, "st": state},
            )
    finally:
        engine.dispose()


def set_policy_row(
    backend: Backend, settings: Settings, version: int, topic: str, state: bytes
) -> None:
    engine, table, _ = policy_engine(backend, settings)
    try:
        with engine.begin() as conn:
            done = conn.execute(
                sa.text(
                    f"UPDATE {table} SET topic = :t, state = :st "
                    "WHERE originator_id = :s AND originator_version = :v"
                ),
                {"s": _key(backend, settings.tenant), "v": version, "t": topic, "st": state},
            )
            assert done.rowcount == 1
    finally:
        engine.dispose()


def delete_policy_rows_from(backend: Backend, settings: Settings, version: int) -> None:
    """Delete the stream's rows from ``version`` up (a cut tail), and its snapshots."""
    engine, table, snapshots = policy_engine(backend, settings)
    try:
        with engine.begin() as conn:
            for name in (table, snapshots):
                conn.execute(
                    sa.text(
                        f"DELETE FROM {name} WHERE originator_id = :s AND originator_version >= :v"
                    ),
                    {"s": _key(backend, settings.tenant), "v": version},
                )
    finally:
        engine.dispose()


def forged_change(app: Any, tenant: str, change: Any) -> tuple[int, str, bytes]:
    """A row a writer of the stores could write: the next event of the tenant's policy,
    made by ``change(policy)``, mapped by the library's plain mapper (no key)."""
    policy: TenantPolicy = app.repository.get(policy_id(tenant))
    change(policy)
    (event,) = policy.collect_events()
    stored = Mapper(transcoder=app.mapper.transcoder).to_stored_event(event)
    return int(stored.originator_version), str(stored.topic), bytes(stored.state)


def copy_policy_store(backend: Backend, settings: Settings, to: Path) -> None:
    """Copy the policy store aside (SQLite: the file; PostgreSQL: its rows)."""
    to.mkdir(parents=True, exist_ok=True)
    if backend.kind == "sqlite":
        src = sa.create_engine(f"sqlite:///{Path(settings.data_dir) / POLICY_FILE}")
        try:
            with src.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            src.dispose()
        shutil.copy2(Path(settings.data_dir) / POLICY_FILE, to / POLICY_FILE)
        return
    engine, table, snapshots = policy_engine(backend, settings)
    try:
        with engine.connect() as conn:
            for name in (table, snapshots):
                rows = conn.execute(
                    sa.text(f"SELECT originator_id, originator_version, topic, state FROM {name}")
                ).all()
                (to / name).write_text(
                    "\n".join(f"{r[0]}|{r[1]}|{r[2]}|{bytes(r[3]).hex()}" for r in rows)
                )
    finally:
        engine.dispose()


def put_policy_store_back(backend: Backend, settings: Settings, frm: Path) -> None:
    """Put a copy from ``copy_policy_store`` in place of the live policy store."""
    if backend.kind == "sqlite":
        live = Path(settings.data_dir) / POLICY_FILE
        for suffix in ("-wal", "-shm"):
            Path(str(live) + suffix).unlink(missing_ok=True)
        shutil.copy2(frm / POLICY_FILE, live)
        return
    engine, table, snapshots = policy_engine(backend, settings)
    try:
        with engine.begin() as conn:
            for name in (table, snapshots):
                conn.execute(sa.text(f"DELETE FROM {name}"))
                text = (frm / name).read_text()
                for line in filter(None, text.split("\n")):
                    sid, version, topic, state = line.split("|")
                    conn.execute(
                        sa.text(
                            f"INSERT INTO {name} (originator_id, originator_version, topic, "
                            "state) VALUES (:s, :v, :t, :st)"
                        ),
                        {"s": sid, "v": int(version), "t": topic, "st": bytes.fromhex(state)},
                    )
    finally:
        engine.dispose()


def policy_to_legacy(k: Any, *, keep_snapshots: bool = False) -> int:
    """Make the policy store of ``k`` as a deployment of before the seal holds it: every
    row untagged (snapshots untagged too with ``keep_snapshots``, else none), no anchor of
    the policy log, no upgrade record. The event rows re-written."""
    from uprof.crypto.keydir import UPGRADE_FILE_PREFIX
    from uprof.crypto.mapper import PLAIN_TAG
    from uprof.crypto.tables import stream_heads
    from uprof.services.policy_seal import BEGUN, UPGRADE

    app = k.policy.app
    settings = k.settings
    if k.app.backend.name == "sqlite":
        engine = sa.create_engine(f"sqlite:///{Path(settings.data_dir) / POLICY_FILE}")
        table, snapshots = "stored_events", "stored_snapshots"
    else:
        engine = k.app.events_engine
        table, snapshots = "policies_events", "policies_snapshots"
    n = 0
    try:
        with engine.begin() as conn:
            rows = conn.execute(
                sa.text(f"SELECT originator_id, originator_version, state FROM {table}")
            ).all()
            for sid, version, state in rows:
                state = bytes(state)
                assert state[:1] == b"\x03"
                conn.execute(
                    sa.text(
                        f"UPDATE {table} SET state = :st "
                        "WHERE originator_id = :s AND originator_version = :v"
                    ),
                    {"st": state[5 + PLAIN_TAG :], "s": sid, "v": version},
                )
                n += 1
            if not keep_snapshots:
                conn.execute(sa.text(f"DELETE FROM {snapshots}"))
            for sid, version, state in conn.execute(
                sa.text(f"SELECT originator_id, originator_version, state FROM {snapshots}")
            ).all():
                conn.execute(
                    sa.text(
                        f"UPDATE {snapshots} SET state = :st "
                        "WHERE originator_id = :s AND originator_version = :v"
                    ),
                    {"st": bytes(state)[5 + PLAIN_TAG :], "s": sid, "v": version},
                )
    finally:
        if k.app.backend.name == "sqlite":
            engine.dispose()
    with k.keys_engine.begin() as conn:
        conn.execute(stream_heads.delete().where(stream_heads.c.log_id == app.log_id))
    for name in (UPGRADE, BEGUN):
        (settings.key_path / f"{UPGRADE_FILE_PREFIX}{name}").unlink(missing_ok=True)
    return n
