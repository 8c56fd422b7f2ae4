"""``uprof policy show|history|grant|revoke``: the authorization policy, from the shell.

The command line acts as the local operator (whoever can read the data and key stores);
every change is recorded under the label ``operator:local#cli``, as an event in the policy
store and a ``policy.changed`` audit entry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from uprof.cli.context import CheckedTyper, console, door, parse_time

#: The label the command line's policy changes are recorded under.
CLI_OPERATOR = "operator:local#cli"

policy_app = CheckedTyper(
    no_args_is_help=True, help="Show, grant and revoke the authorization policy; its history."
)

AppOpt = Annotated[str | None, typer.Option("--app", help="The app whose permissions change.")]
RoleOpt = Annotated[
    str | None, typer.Option(help="A role: give it to --app, or (without --app) add rules to it.")
]
ActionOpt = Annotated[
    list[str] | None,
    typer.Option("--action", help="read, capture, propose, erase, export, audit (repeat or a,b)."),
]
CategoryOpt = Annotated[
    list[str] | None,
    typer.Option("--category", help="Catalogue categories or 'any' (repeat or a,b)."),
]
PurposeOpt = Annotated[str | None, typer.Option(help="Purpose of the rules ('*': every purpose).")]
EffectOpt = Annotated[str, typer.Option(help="allow or deny (deny wins).")]


def split_names(values: Sequence[str] | None) -> list[str]:
    """Flatten repeated and comma-separated option values."""
    return [part.strip() for value in values or () for part in value.split(",") if part.strip()]


def _print_result(result: Any, verb: str) -> None:
    if not result.changes:
        console.print(f"nothing to {verb}: the policy already says so (version {result.version})")
        return
    for change in result.changes:
        console.print(f"{change.change}: {', '.join(change.row)}", highlight=False)
    console.print(f"policy version {result.version}")


def _change(verb: str, **kwargs: Any) -> None:
    with door(creates=True) as d:
        method = d.policy_grant if verb == "grant" else d.policy_revoke
        _print_result(method(**kwargs), verb)


@policy_app.command("grant")
def grant(
    app_id: AppOpt = None,
    role: RoleOpt = None,
    action: ActionOpt = None,
    category: CategoryOpt = None,
    purpose: PurposeOpt = None,
    effect: EffectOpt = "allow",
) -> None:
    """Give --app a --role, or add rules: each --action x --category for --purpose."""
    _change(
        "grant",
        app_id=app_id,
        role=role,
        actions=split_names(action),
        categories=split_names(category),
        purpose=purpose,
        effect=effect,
    )


@policy_app.command("revoke")
def revoke(
    app_id: AppOpt = None,
    role: RoleOpt = None,
    action: ActionOpt = None,
    category: CategoryOpt = None,
    purpose: PurposeOpt = None,
    effect: EffectOpt = "allow",
) -> None:
    """Take back a --role from --app, or remove rules (every one named must be in force)."""
    _change(
        "revoke",
        app_id=app_id,
        role=role,
        actions=split_names(action),
        categories=split_names(category),
        purpose=purpose,
        effect=effect,
    )


@policy_app.command("show")
def show(
    at: Annotated[
        str | None, typer.Option(help="The policy in force then (ISO 8601, zone).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Print the policy in force now, or at a past time."""
    when = parse_time(at, "--at")
    with door() as d:
        state = d.policy_show(when)
    if as_json:
        console.print_json(json.dumps(asdict(state), default=str))
        return
    at_text = state.at.isoformat() if state.at else "never"
    console.rule(f"[bold]policy[/] of tenant {state.tenant}: version {state.version} ({at_text})")
    table = Table(title="rules", title_justify="left", expand=True)
    for column in ("subject", "action", "category", "purpose", "effect"):
        table.add_column(column)
    for rule in state.rules:
        table.add_row(rule.subject, rule.action, rule.category, rule.purpose, rule.effect)
    console.print(table)
    roles = Table(title="roles", title_justify="left", expand=True)
    roles.add_column("app")
    roles.add_column("role")
    for assignment in state.assignments:
        roles.add_row(assignment.member, assignment.role)
    console.print(roles)


@policy_app.command("history")
def history(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Print every change of the policy, oldest first, with who asked."""
    with door() as d:
        changes = d.policy_history()
    if as_json:
        console.print_json(json.dumps([asdict(c) for c in changes], default=str))
        return
    table = Table(expand=True)
    for column in ("version", "at", "change", "row", "requested by"):
        table.add_column(column, overflow="fold")
    for c in changes:
        row = ", ".join(c.row) if c.row else f"{c.rows} rows from {c.source}"
        table.add_row(str(c.version), c.at.isoformat(), c.change, row, c.requested_by)
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add the ``policy`` group to the main CLI."""
    app.add_typer(policy_app, name="policy")
