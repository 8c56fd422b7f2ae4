"""A write into an event table altered under a running process
(0238-shapes-under-running-processes, bug WR): PostgreSQL converts the library's values
into a column altered to text by hand (an assignment cast), so a new stream's first write
(no row of it to read first) went in, stored in a form no read can use, and the caller
was told it succeeded. Now the write looks at the table's types in its own transaction:
refused as damage (``stored_data_damaged``), nothing written to the log."""

from __future__ import annotations

import pytest

from domain.errors import StoredDataDamagedError
from tests.conftest import Backend
from tests.e2e.test_review_of_0220 import _alter_by_hand
from tests.e2e.test_store_damage_servers import _count_events
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, consented_settings, running

#: ``ALTER COLUMN`` of ``profiles_events``: a column the library writes, to text.
RETYPED = [
    pytest.param("state TYPE text USING encode(state, 'hex')", id="state-text"),
    pytest.param("originator_version TYPE text USING originator_version::text", id="version-text"),
]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize("using", RETYPED)
def test_wr_a_new_streams_first_write_into_a_column_of_another_type_is_damage(
    backend: Backend, using: str
) -> None:
    """Bug WR: ``profiles_events`` altered by hand while a process runs whose pooled
    connection has not read the table since (a server's pool grows under load; a read
    prepared before the change is refused as a stale plan and told as damage, UO/VA).
    carol's consent is her stream's first write: its read of her stream finds no row, and
    on main the write went in, its two rows stored as text (every read of them after:
    damage), and the caller was told it succeeded. Now refused as damage with the restore
    hint, twice, nothing written."""
    settings = consented_settings(backend)
    with running(settings, FakeClock()) as kernel:
        before = _count_events(backend, settings)
        _alter_by_hand(backend, settings, f"ALTER TABLE profiles_events ALTER COLUMN {using}")
        for _ in range(2):
            with pytest.raises(StoredDataDamagedError) as refused:
                consent(kernel, "carol")
            assert "uprof restore" in refused.value.hint, refused.value
            assert "profiles_events" not in str(refused.value), refused.value
        assert _count_events(backend, settings) == before
