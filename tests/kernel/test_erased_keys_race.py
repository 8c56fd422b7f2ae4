"""Two processes recording the same erasure in the data stores at once (both backends, a
real second process).

``erased_keys.record`` is called by an erasure (before its keys go) and by every start
that finds an erasure in the ledger the data stores lack (decision 0062): a process
starting while another erases can record the same row at the same moment. The record
read which rows were there, then inserted the missing ones: when the other process
inserted in between, the insert failed on the primary key, so the erasure answered an
error half-way (its keys not yet destroyed) or the start crashed. Recording is
idempotent, whoever gets there first.
"""

from __future__ import annotations

import textwrap
import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from tests.children import run_python
from tests.conftest import Backend
from uprof.kernel import Uprof
from uprof.services import erased_keys


class _OtherRecordsAfterFirstRead:
    """A connection that, right after the first read of ``erased_keys`` through its
    engine, lets another process record the same erasure to completion."""

    def __init__(self, conn: sa.Connection, engine: _Engine) -> None:
        self._conn, self._engine = conn, engine

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._conn.execute(statement, *args, **kwargs)
        if not self._engine.ran and isinstance(statement, sa.Select):
            rows = result.all()
            self._engine.ran = True
            done = run_python(self._engine.script, timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
            return _Rows(rows)
        return result


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def scalars(self) -> list[Any]:
        return [r[0] for r in self._rows]


class _Engine:
    def __init__(self, engine: sa.Engine, script: str) -> None:
        self._engine, self.script, self.ran = engine, script, False

    def begin(self) -> Any:
        engine, outer = self._engine, self

        class _Begin:
            def __enter__(self) -> _OtherRecordsAfterFirstRead:
                self._cm = engine.begin()
                return _OtherRecordsAfterFirstRead(self._cm.__enter__(), outer)

            def __exit__(self, *exc: Any) -> Any:
                return self._cm.__exit__(*exc)

        return _Begin()


def test_an_erasure_recorded_by_another_process_meanwhile_is_recorded_once(
    backend: Backend, kernel: Uprof
) -> None:
    stream = str(uuid.uuid4())
    url = kernel.views_engine.url.render_as_string(hide_password=False)
    script = textwrap.dedent(
        f"""
        from datetime import UTC, datetime
        from uprof.services import erased_keys
        from uprof.storage import create_engine
        engine = create_engine({url!r})
        erased_keys.record(engine, {stream!r}, now=datetime.now(UTC), mark="m")
        engine.dispose()
        """
    )

    erased_keys.record(
        _Engine(kernel.views_engine, script),  # type: ignore[arg-type]
        stream,
        now=datetime.now(UTC),
        mark="m",
    )

    assert stream in erased_keys.read(kernel.views_engine).streams
