"""Backup, restore, re-creating erased subjects, and moving key files out of the data folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from domain.errors import UprofError
from uprof.cli.context import (
    CheckedTyper,
    console,
    cursor_option,
    door,
    fail,
    limit_option,
    print_page,
    settings,
)

subjects_app = CheckedTyper(
    no_args_is_help=True, help="Manage subject ids (re-create erased ones)."
)


def register(app: typer.Typer, keys_app: typer.Typer) -> None:
    app.command("backup")(backup_command)
    app.command("restore")(restore_command)
    app.add_typer(subjects_app, name="subjects")
    keys_app.command("move-out")(keys_move_out)


def backup_command(
    to: Annotated[Path, typer.Option("--to", help="A new folder for the backup.")],
) -> None:
    """Write a consistent backup of the data stores, without any key material."""
    try:
        with door() as d:
            report = d.backup(to)
    except UprofError as e:
        fail(e)
        return
    files = ", ".join(f"{name} ({n} bytes)" for name, n in sorted(report.files.items()))
    console.print(
        f"backup written to {report.path}: {files}; {report.audit_entries} audit entries; "
        "no key material (keep the key folder's own backup apart)"
    )


def restore_command(
    source: Annotated[Path, typer.Option("--from", help="A folder written by `uprof backup`.")],
    allow_unsigned: Annotated[
        bool,
        typer.Option(
            "--allow-unsigned",
            help="Restore a backup whose manifest is not signed (written before "
            "2026-12-04), or is signed by an audit key rotated out since (its signature "
            "binds nothing a leaked old key could not sign); check where it came from first.",
        ),
    ] = False,
    restart_audit_log: Annotated[
        bool,
        typer.Option(
            "--restart-audit-log",
            help="Restore a backup taken before an audit key rotation when no later one is "
            "left: the audit log restarts at the backup's entries, and the current audit key "
            "signs that restart into the key history (audit-keys.json); receipts and "
            "checkpoints of what was logged after the backup are refused from then on. "
            "Refused when the backup's log reaches every rotation point.",
        ),
    ] = False,
) -> None:
    """Replace the data stores with a backup, then re-apply the erasure ledger.

    Stop every uprof process on this deployment first.
    """
    from uprof.services.backup import restore

    try:
        report = restore(
            settings(),
            source,
            allow_unsigned=allow_unsigned,
            restart_audit_log=restart_audit_log,
        )
    except UprofError as e:
        fail(e)
        return
    ledger = report.ledger
    console.print(
        f"restored {report.backend} data from {source}; audit log: "
        f"{'live log kept' if report.audit_kept_live else 'taken from the backup'} "
        f"({report.audit_entries} entries); erasure ledger re-applied: "
        f"{ledger.erased_streams} erased subjects, {ledger.erased_captures} erased captures, "
        f"{ledger.resurrected} resurrected rows destroyed"
        + (", read models rebuilt" if ledger.rebuilt else "")
        + (
            f"; audit log restarted at {report.audit_restarted_at} entries (recorded in the "
            "audit key history: take a new backup now)"
            if report.audit_restarted_at is not None
            else ""
        )
    )


@subjects_app.command("list")
def subjects_list(
    limit: Annotated[int | None, limit_option()] = None,
    cursor: Annotated[str | None, cursor_option()] = None,
) -> None:
    """List live subjects by audit pseudonym, oldest first, a page at a time (JSON).

    References are never stored, so they are never listed; a pseudonym filters
    `uprof audit entries --subject` and the console's audit search.
    """
    with door() as d:
        page = d.list_subjects(cursor=cursor, limit=limit)
        items = [
            {"pseudonym": s.pseudonym, "created_at": s.created_at.isoformat()} for s in page.items
        ]
        print_page(items, page.next_cursor)


@subjects_app.command("recreate")
def subjects_recreate(
    subject: Annotated[str, typer.Option(help="The erased subject reference to allow again.")],
) -> None:
    """Allow an erased subject id again, as a new subject unlinkable to the erased one."""
    with door() as d:
        pseudonym = d.recreate_subject(subject)
    console.print(
        f"subject re-created with the new pseudonym {pseudonym}; grant consent before capturing"
    )


def keys_move_out() -> None:
    """Move key files an older uprof kept in the data folder into the key folder.

    Stop every uprof process on this deployment first.
    """
    from uprof.bootstrap import refuse_without_deployment
    from uprof.crypto.keydir import move_key_material

    s = settings()
    try:
        # Before the key folder is made: a data folder that is not there ended in a
        # FileNotFoundError traceback, after making the key folder (bug WO).
        refuse_without_deployment(s)
        moved = move_key_material(s.data_dir, s.key_path)
    except UprofError as e:
        fail(e)
        return
    if not moved:
        console.print(f"no key material in {s.data_dir}; nothing to move")
        return
    console.print(f"moved {', '.join(moved)} from {s.data_dir} to {s.key_path}")
    # Recorded once the keys are where the deployment opens them: the move itself runs
    # with no uprof process (and no log) open.
    with door() as d:
        d.key_material_moved(moved)
