"""A policy table of the wrong shape (its columns made by hand), met by a new CLI
process (review of 0203 and 0205, bug RF; 0203's Left called it a traceback): every
command, and a server's start, ends in one error line, exit 7 (stored data damaged),
never a traceback. Real processes. On main at bd570378 each command ended in the
driver's "no such column" (SQLite) or "column ... does not exist" (PostgreSQL)."""

from __future__ import annotations

from tests.conftest import Backend
from tests.policies.conftest import on_the_policy_table
from tests.policies.test_policy_store_tampered import COMMANDS, _deployment, _said
from uprof.settings import Settings


def _reshaped_policy_table(backend: Backend, settings: Settings) -> None:
    """The policy's event table dropped and made again with columns of its own."""
    on_the_policy_table(
        backend,
        settings,
        "DROP TABLE {table}",
        "CREATE TABLE {table} (id INTEGER PRIMARY KEY, note TEXT)",
    )


def test_a_policy_table_of_the_wrong_shape_ends_in_one_error_line(backend: Backend) -> None:
    settings = _deployment(backend)
    _reshaped_policy_table(backend, settings)
    for command in COMMANDS:
        code, said = _said(settings, *command)
        assert code == 7, (command, code, said)
        assert said.startswith("error: policy store damaged"), (command, said)
        assert "lacks the column(s)" in said and "uprof restore" in said, (command, said)


def test_the_servers_refuse_to_start_on_a_policy_table_of_the_wrong_shape(
    backend: Backend,
) -> None:
    settings = _deployment(backend)
    _reshaped_policy_table(backend, settings)
    for command in (("serve", "--port", "0"), ("worker",)):
        code, said = _said(settings, *command)
        assert code == 7, (command, code, said)
        assert said.startswith("error: policy store damaged"), (command, said)
