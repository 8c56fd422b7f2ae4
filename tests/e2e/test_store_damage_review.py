"""0214-store-damage-in-servers attacked (0216-review-of-0211-to-0214): a running
``uprof serve`` (real process on loopback, SQLite and PostgreSQL) meeting two different
tables of the wrong shape, one after the other (bug TE): "logged once" keyed on the
damage's text, which names no column, so the second was never logged and the operator's
one line named neither. Each missing column is now logged once, named (uprof's own
schema, public in its source); the answers name none."""

from __future__ import annotations

import pytest

from tests.by_hand import by_hand
from tests.conftest import Backend
from tests.e2e.test_store_damage_servers import (
    _RENAMED_APP_ID,
    CAPTURE,
    CONSENTS,
    EVENTS_TABLE,
    Served,
    _damaged,
    served,  # noqa: F401  (the fixture)
)


@pytest.fixture
def server(served: Served) -> Served:  # noqa: F811  (test_store_damage_servers's fixture)
    return served


_SHAPE_LINE = "a table of the stores is not of the shape uprof made"


def test_te_a_second_different_table_of_the_wrong_shape_is_logged_too(
    backend: Backend, server: Served
) -> None:
    by_hand(backend, server.settings, "views.sqlite", _RENAMED_APP_ID)
    for _ in range(2):
        answer = server.post(*CONSENTS)
        _damaged(answer)
        assert "app_id" not in answer.text
    table = EVENTS_TABLE[backend.kind]
    by_hand(
        backend,
        server.settings,
        "events.sqlite",
        f"ALTER TABLE {table} RENAME COLUMN originator_version TO v2",
    )
    for _ in range(2):
        answer = server.post(*CAPTURE)
        _damaged(answer)
        assert "originator_version" not in answer.text
    lines = [line for line in server.log().splitlines() if _SHAPE_LINE in line]
    named = {
        column: [line for line in lines if f"column {column} " in line]
        for column in ("app_id", "originator_version")
    }
    assert all(len(found) == 1 for found in named.values()), lines
    assert len(lines) == 2, lines
    assert not any("SELECT" in line or "INSERT" in line for line in lines), lines


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_held_the_same_damage_met_again_is_not_logged_again(
    backend: Backend, server: Served
) -> None:
    by_hand(backend, server.settings, "views.sqlite", _RENAMED_APP_ID)
    for _ in range(4):
        _damaged(server.post(*CONSENTS))
    assert server.log().count(_SHAPE_LINE) == 1, server.log()[-3000:]
