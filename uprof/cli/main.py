"""uprof: capture, consent, profiles, projections, benchmarks and the demo."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from domain.errors import ItemNotFoundError
from uprof.cli.context import (
    STATE,
    CheckedTyper,
    built_from_options,
    console,
    cursor_option,
    door,
    err_console,
    fail,
    kernel,
    limit_option,
    parse_time,
    print_page,
    settings,
    sharing_option,
    writable_file,
)
from uprof.cli.render import print_evidence, print_profile, print_receipt

if TYPE_CHECKING:
    from rich.progress import Progress

    from uprof.facade import Facade

# Plain help: Rich's boxes wrap error text mid-word and show a type (even <bool>) for
# every flag; plain click help reads the same in a terminal, a log and a test.
app = CheckedTyper(no_args_is_help=True, add_completion=False, help=__doc__, rich_markup_mode=None)
consent_app = CheckedTyper(no_args_is_help=True, help="Grant, withdraw and list consents.")
profile_app = CheckedTyper(
    no_args_is_help=True, help="Show profiles and the evidence behind items."
)
projections_app = CheckedTyper(no_args_is_help=True, help="Run, rebuild and inspect projections.")
app.add_typer(consent_app, name="consent")
app.add_typer(profile_app, name="profile")
quarantine_app = CheckedTyper(
    no_args_is_help=True,
    help="List and retry captures whose extraction failed on every attempt.",
)
app.add_typer(projections_app, name="projections")
app.add_typer(quarantine_app, name="quarantine")


def _progress() -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


@app.callback()
def main(
    data_dir: Annotated[
        Path | None, typer.Option(help="Folder of the embedded SQLite stores (UPROF_DATA_DIR).")
    ] = None,
    key_dir: Annotated[
        Path | None,
        typer.Option(help="Folder of the key material (UPROF_KEY_DIR; default <data-dir>.keys)."),
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="PostgreSQL URL instead of SQLite (UPROF_DATABASE_URL).")
    ] = None,
    embedder: Annotated[
        str | None,
        typer.Option(
            help="minilm (default), mpnet (better retrieval; `uprof models fetch mpnet`) or"
            " hashing (fast, lexical fallback)."
        ),
    ] = None,
) -> None:
    STATE.data_dir = data_dir
    STATE.key_dir = key_dir
    STATE.database_url = database_url
    STATE.embedder = embedder


@app.command()
def init() -> None:
    """Make a new deployment in the data folder (or database) and its key folder, or say
    that one is there already (changing nothing). The commands that read a deployment
    refuse a place holding none; this, `serve` and `apps create` start one."""
    from domain.errors import DeploymentNotFoundError
    from uprof.bootstrap import deployment_found, deployment_place

    chosen = settings()
    try:
        found = deployment_found(chosen)
    except DeploymentNotFoundError as refused:  # a database the server does not have (XC)
        fail(refused)
    with kernel(creates=True):
        pass  # the start makes what is missing: stores, keys, the seeded policy
    said = "found a uprof deployment in" if found else "made a new uprof deployment in"
    console.print(
        f"{said} {deployment_place(chosen)}, key folder {chosen.key_path}",
        highlight=False,
        soft_wrap=True,
    )


# ----------------------------------------------------------------------- capture


@app.command()
def capture(
    subject: Annotated[str, typer.Option(help="Who the interaction is about.")],
    app_id: Annotated[str, typer.Option("--app", help="The app reporting it.")],
    agent: Annotated[str, typer.Option(help="The agent that took part.")],
    text: Annotated[str, typer.Option(help="What the user said.")],
    response: Annotated[str, typer.Option(help="What the agent answered.")] = "",
    session: Annotated[str, typer.Option(help="Session id.")] = "",
    source_ref: Annotated[str, typer.Option(help="Your own reference, kept verbatim.")] = "",
    at: Annotated[str | None, typer.Option(help="When it happened (ISO 8601, with zone).")] = None,
    purpose: Annotated[str, typer.Option(help="Purpose it is collected for.")] = "personalization",
    sharing: Annotated[
        str, typer.Option(help="private | shared | shared:<types>", callback=sharing_option)
    ] = "private",
) -> None:
    """Capture one interaction through the consent gate."""
    from uprof.schemas.capture import InteractionIn

    row = built_from_options(
        InteractionIn,
        _CAPTURE_OPTIONS,
        subject=subject,
        app_id=app_id,
        agent_id=agent,
        user_input=text,
        agent_response=response,
        session_id=session,
        source_ref=source_ref,
        purpose=purpose,
        sharing=sharing,
        occurred_at=parse_time(at, "--at") or datetime.now(tz=UTC),
    )
    with door(creates=True) as d:
        ack = d.for_app(app_id).capture(subject, row.to_domain())
        console.print(f"captured [bold]{ack.capture_id}[/] at log position {ack.notification_id}")


#: ``uprof capture``'s options, by the request field each gives.
_CAPTURE_OPTIONS = {
    "subject": "--subject",
    "app_id": "--app",
    "agent_id": "--agent",
    "user_input": "--text",
    "agent_response": "--response",
    "session_id": "--session",
    "source_ref": "--source-ref",
    "purpose": "--purpose",
    "sharing": "--sharing",
    "occurred_at": "--at",
}


@app.command("import")
def import_jsonl(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The file to import.")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto (default), interactions (uprof JSONL), openai (chat messages JSONL) "
            "or mem0 (a get_all export).",
        ),
    ] = "auto",
    app_id: Annotated[
        str | None, typer.Option("--app", help="The app chat and Mem0 records are captured as.")
    ] = None,
    subject: Annotated[
        str | None, typer.Option(help="Subject of records that name none (chat, Mem0).")
    ] = None,
    agent: Annotated[str, typer.Option(help="Agent id for chat and Mem0 records.")] = (
        "agent:import"
    ),
    at: Annotated[
        str | None, typer.Option(help="Time of chat and Mem0 records that give none (ISO 8601).")
    ] = None,
    purpose: Annotated[str, typer.Option(help="Purpose of chat and Mem0 records.")] = (
        "personalization"
    ),
    sharing: Annotated[
        str,
        typer.Option(
            help="Sharing of chat and Mem0 records: private | shared | shared:<types>",
            callback=sharing_option,
        ),
    ] = "private",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and count every record; write nothing.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Write nothing unless every record passes.")
    ] = False,
) -> None:
    """Capture every record of a file through the consent gate, record by record.

    A bad record (unreadable, a field out of shape, an app the policy does not let
    capture, no consent, an erased subject) is reported with its line and skipped; the
    others are imported, and the command exits 1. --strict writes nothing unless every
    record passes. Safe to run again: records already captured (same app and
    source_ref, or the same idempotency_key) are skipped and counted.
    """
    from uprof.facade import IMPORT_FORMATS, FileLines, ImportDefaults

    if fmt not in IMPORT_FORMATS:
        raise typer.BadParameter(f"--format must be one of {', '.join(IMPORT_FORMATS)}")
    if not stat.S_ISREG(path.stat().st_mode):
        # A FIFO would be drained by the counting pass, /dev/zero never ends.
        raise typer.BadParameter(f"{path} is not a regular file (a pipe or a device)")
    defaults = ImportDefaults(
        app_id=app_id,
        subject=subject,
        agent_id=agent,
        occurred_at=parse_time(at, "--at"),
        purpose=purpose,
        sharing=sharing,
    )
    lines = FileLines(path)  # a line at most 4 MiB in memory; read again by --strict
    total = None
    if fmt != "mem0":
        total = sum(1 for line in lines if line.strip())
    with door(creates=not dry_run) as d, _progress() as bar:
        task = bar.add_task("checking" if dry_run else "importing", total=total)
        report = d.import_interactions(
            lines,
            fmt=fmt,
            defaults=defaults,
            dry_run=dry_run,
            strict=strict,
            progress=lambda n: bar.advance(task, n),
        )
    for problem in report.failed[:MAX_PROBLEMS_SHOWN]:
        # The file's own text (a role, a time) is in the message: never read as markup.
        err_console.print(f"[red]failed[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
    if len(report.failed) > MAX_PROBLEMS_SHOWN:
        err_console.print(f"... and {len(report.failed) - MAX_PROBLEMS_SHOWN} more failed records")
    for where in report.erased[:MAX_PROBLEMS_SHOWN]:
        console.print(
            f"skipped {escape(where)}: its capture was erased at the subject's request",
            highlight=False,
        )
    if len(report.erased) > MAX_PROBLEMS_SHOWN:
        console.print(f"... and {len(report.erased) - MAX_PROBLEMS_SHOWN} more erased records")
    verb = "would capture" if report.dry_run else "captured"
    console.print(
        f"{verb} {report.captured} interactions from {report.lines} records for "
        f"{report.subjects} subjects; skipped {report.skipped} already captured; "
        f"{len(report.failed)} records failed"
        + ("; dry run: nothing was written" if report.dry_run else "")
        + ("; strict: nothing was written" if report.refused else ""),
        highlight=False,
        soft_wrap=True,
    )
    if report.stopped_by is not None:
        # What stopped the run decides the exit, as for any command: an outage 1, a
        # damaged store 7 with its hint (bug QX: every stop exited 1).
        err_console.print(f"[red]stopped[/] after {report.lines} records", highlight=False)
        fail(report.stopped_by)
    if report.failed:
        raise typer.Exit(1)


#: Failed records printed one per line; the rest are counted.
MAX_PROBLEMS_SHOWN = 50


# ----------------------------------------------------------------------- consent


@consent_app.command("grant")
def consent_grant(
    subject: Annotated[str, typer.Option()],
    app_id: Annotated[str, typer.Option("--app")],
    category: Annotated[list[str], typer.Option(help="Repeat; * for every category.")],
    purpose: Annotated[list[str], typer.Option(help="Repeat for several purposes.")],
    basis: Annotated[str, typer.Option(help="Lawful basis.")] = "consent",
    expires: Annotated[str | None, typer.Option(help="Expiry (ISO 8601, with zone).")] = None,
    collected_by: Annotated[
        str, typer.Option(help="Your record of the user's consent (e.g. form:2024-05-01:17).")
    ] = "",
) -> None:
    """Record, as the operator, a consent the user gave an app (the app's policy must
    let it hold consent for those categories and purposes)."""
    with door(creates=True) as d:
        consent_id = d.grant_consent(
            subject,
            app_id=app_id,
            categories=category,
            purposes=purpose,
            legal_basis=basis,
            expires_at=parse_time(expires, "--expires"),
            collected_by=collected_by,
        )
        console.print(f"consent [bold]{consent_id}[/] granted")


@consent_app.command("withdraw")
def consent_withdraw(
    subject: Annotated[str, typer.Option()],
    consent_id: Annotated[str, typer.Option("--consent")],
    erase: Annotated[
        bool,
        typer.Option(
            "--erase",
            help="Also erase what the app collected under this consent, with a signed receipt.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(help="With --erase: write the signed receipt here.", callback=writable_file),
    ] = None,
) -> None:
    """Withdraw a consent: the next capture under it is refused. With --erase, what the
    app collected under it (between the grant and the withdrawal) is erased too; asking
    again with --erase finishes an erasure that answered erasure_incomplete."""
    if out is not None and not erase:
        err_console.print("[bold red]error:[/] --out: a receipt is written only with --erase")
        raise typer.Exit(2)
    with door() as d:
        result = d.withdraw_consent(subject, consent_id, erase=erase)
        console.print(f"consent {consent_id} withdrawn")
        if not erase:
            return
        if result is None:
            console.print("nothing collected under it is left to erase")
            return
        console.print(f"{result.counts.get('captures', 0)} captured events erased")
        print_receipt(console, result, out)


@consent_app.command("list")
def consent_list(
    subject: Annotated[str, typer.Option()],
    limit: Annotated[int | None, limit_option()] = None,
    cursor: Annotated[str | None, cursor_option()] = None,
) -> None:
    """List a subject's consents, a page at a time (a JSON array; stderr says if more follow)."""
    with door() as d:
        page = d.list_consents(subject, cursor=cursor, limit=limit)
        rows = [
            {
                "consent_id": c.consent_id,
                "app": c.app_id,
                "categories": c.categories,
                "purposes": c.purposes,
                "basis": c.legal_basis,
                "granted_at": c.granted_at.isoformat(),
                "withdrawn_at": c.withdrawn_at.isoformat() if c.withdrawn_at else None,
            }
            for c in page.items
        ]
        console.print_json(json.dumps(rows))
        if page.next_cursor is not None:
            err_console.print(
                f"more: repeat with --cursor {page.next_cursor}", highlight=False, soft_wrap=True
            )


# ----------------------------------------------------------------------- profile


@profile_app.command("show")
def profile_show(
    subject: Annotated[str, typer.Option()],
    as_of: Annotated[str | None, typer.Option(help="Show it as it stood then (ISO 8601).")] = None,
    memories: Annotated[int, typer.Option(help="How many recent memories to list.")] = 12,
) -> None:
    """Show a subject's attributes, intents, memories and consents with evidence."""
    with door() as d:
        view = d.profile(subject, as_of=parse_time(as_of, "--as-of"))
        print_profile(console, subject, view, max_memories=memories)


@profile_app.command("memories")
def profile_memories(
    subject: Annotated[str, typer.Option()],
    limit: Annotated[int | None, limit_option()] = None,
    cursor: Annotated[str | None, cursor_option()] = None,
) -> None:
    """List a subject's memories, oldest first, a page at a time (JSON)."""
    with door() as d:
        page = d.list_memories(subject, cursor=cursor, limit=limit)
        items = [
            {
                "item_id": m.item_id,
                "text": m.text,
                "category": m.category,
                "provenance": m.provenance,
                "occurred_at": m.occurred_at.isoformat(),
                "archived": m.archived,
                "evidence": list(m.evidence),
                "source_refs": list(m.source_refs),
            }
            for m in page.items
        ]
        print_page(items, page.next_cursor)


@profile_app.command("evidence")
def profile_evidence(
    subject: Annotated[str, typer.Option()],
    item: Annotated[str, typer.Option(help="Item id (from `profile show`; a prefix works).")],
) -> None:
    """Show the captured events behind one item."""
    with door() as d:
        try:  # a whole id: the item's read only (each read is on the log as what it showed)
            found = d.evidence(subject, item)
        except ItemNotFoundError:
            found = d.evidence(subject, _expand_item(d, subject, item))
        print_evidence(console, found)


def _expand_item(d: Facade, subject: str, prefix: str) -> str:
    """The one item id starting with ``prefix`` (a recorded read of the whole profile)."""
    view = d.profile(subject)
    ids = [a.item_id for a in view.attributes] + [i.item_id for i in view.intents]
    ids += [m.item_id for m in view.memories]
    matches = [i for i in ids if i.startswith(prefix)]
    return matches[0] if len(matches) == 1 else prefix


# ------------------------------------------------------------------- projections


@projections_app.command("run")
def projections_run() -> None:
    """Extract and project what the log holds now (what is appended meanwhile is left
    to the running workers, as a rebuild does)."""
    with door() as d:
        console.print(f"processed {d.process()} notifications")


@projections_app.command("rebuild")
def projections_rebuild() -> None:
    """Drop the read models and rebuild them from the event log."""
    with door() as d, _progress() as bar:
        task = bar.add_task("rebuilding", total=d.lag().log_position)
        count = d.rebuild(
            progress=lambda done, total: bar.update(task, completed=done, total=total)
        )
    console.print(f"rebuilt from {count} events")


@projections_app.command("lag")
def projections_lag() -> None:
    """Report how far extraction and projections are behind the log."""
    with door() as d:
        lag = d.lag()
        console.print_json(
            json.dumps(
                {
                    "log_position": lag.log_position,
                    "extraction_pending": lag.extraction_pending,
                    "projection_pending": lag.projection_pending,
                    "quarantined": lag.quarantined,
                    "caught_up": lag.caught_up,
                }
            )
        )


# -------------------------------------------------------------------- quarantine


@quarantine_app.command("list")
def quarantine_list() -> None:
    """Print the quarantined captures as JSON: ids, the subject's pseudonym, the stage
    that failed, the error's class, attempts, when (never content or error messages)."""
    with door() as d:
        held = d.list_quarantined()
    console.print_json(
        json.dumps(
            [
                {
                    "capture_id": q.capture_id,
                    "subject_pseudonym": q.subject,
                    "stage": q.stage,
                    "error": q.error,
                    "attempts": q.attempts,
                    "quarantined_at": q.quarantined_at.isoformat(),
                    "notification_id": q.notification_id,
                }
                for q in held
            ]
        )
    )


@quarantine_app.command("retry")
def quarantine_retry(
    capture_ids: Annotated[
        list[str] | None, typer.Argument(help="Capture ids (from `uprof quarantine list`).")
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Retry every quarantined capture.")] = False,
) -> None:
    """Extract quarantined captures again: each is released (its results saved) or stays
    quarantined; prints one outcome per capture as JSON."""
    if bool(capture_ids) == every:
        err_console.print("[bold red]error:[/] name capture ids, or give --all (not both)")
        raise typer.Exit(2)
    with door() as d:
        outcomes = d.retry_quarantined(None if every else list(capture_ids or ()))
    console.print_json(
        json.dumps(
            [{"capture_id": o.capture_id, "outcome": o.outcome, "error": o.error} for o in outcomes]
        )
    )


@app.command()
def maintain(
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Run the decay job: expire overdue intents, archive the coldest memories past capacity."""
    with door() as d:
        done = d.run_maintenance()
    if as_json:
        console.print_json(json.dumps(done))
        return
    # A sentence, as the CLI's other commands say what they did; --json for scripts (XE).
    shown = (
        "the views show it"
        if done["views_caught_up"]
        else "the views do not show it yet (they catch up; `uprof projections lag`)"
    )
    console.print(
        f"maintenance ran: {done['intents_expired']} overdue intents expired, "
        f"{done['memories_archived']} memories archived; {shown}",
        highlight=False,
        soft_wrap=True,
    )


#: Entry point group of commands that other packages add to ``uprof``: each entry is a
#: ``register(app)`` function. The benchmarks add ``uprof bench`` this way
#: (benchmarks/cli.py), so the product never imports them.
PLUGIN_GROUP = "uprof.cli"


def _register_optional_commands() -> None:
    from uprof.cli import demo, extractor, govern, keyops, models, serve, worker
    from uprof.cli import policy as policy_cli
    from uprof.mcp import cli as mcp_cli

    app.command("demo")(demo.demo)
    govern.register(app)
    keyops.register(app, govern.keys_app)
    serve.register(app)
    policy_cli.register(app)
    worker.register(app)
    extractor.register(app)
    models.register(app)
    mcp_cli.register(app)


def _register_plugin_commands() -> None:
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        entry.load()(app)


_register_optional_commands()
_register_plugin_commands()


if __name__ == "__main__":  # python -m uprof.cli.main ...
    app()
