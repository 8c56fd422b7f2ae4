"""Governance commands: slices, erasure, subject export, audit trail, residue, keys."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from uprof.cli.context import (
    CheckedTyper,
    console,
    cursor_option,
    door,
    err_console,
    limit_option,
    print_page,
    writable_file,
)
from uprof.cli.render import print_receipt
from uprof.documents import MAX_DOCUMENT_BYTES, read_at_most

erase_app = CheckedTyper(no_args_is_help=True, help="Erase a subject, one event or one item.")
audit_app = CheckedTyper(no_args_is_help=True, help="Export and verify the audit trail; residue.")
keys_app = CheckedTyper(no_args_is_help=True, help="Key management.")

#: ``--key-history`` of the offline verifiers (``audit verify``, ``verify-receipt``,
#: ``verify-proof``): one definition, so the three explain it alike.
KeyHistoryFile = Annotated[
    Path | None,
    typer.Option(
        exists=True,
        dir_okay=False,
        help="The log's key history (`uprof audit keys`): accept the keys it endorses "
        "after (or before) the pinned one.",
    ),
]
RotationProofFile = Annotated[
    Path | None,
    typer.Option(
        exists=True,
        dir_okay=False,
        help="For a file whose key was rotated out after it was signed: the log's "
        "consistency proof from its checkpoint to the rotation point (a JSON list of base64 "
        "hashes, from `uprof audit rotation-proof`).",
    ),
]


def read_document(path: Path, option: str, *, head: bool = False) -> bytes:
    """The bytes of a file handed to ``option``, at most ``MAX_DOCUMENT_BYTES``
    (``uprof.documents.read_at_most``): a longer one is refused (``typer.BadParameter``,
    exit 2) naming the option and the limit. With ``head``, a longer file is not refused:
    its first ``MAX_DOCUMENT_BYTES`` are returned (an export, whose first lines are read)."""
    content = read_at_most(path, head=head)
    if content is None:
        raise _too_long(path, option)
    return content


def _too_long(path: Path, option: str) -> typer.BadParameter:
    return typer.BadParameter(
        f"{shown(path)} is longer than {MAX_DOCUMENT_BYTES} bytes, the most uprof reads "
        "of a receipt, proof document, key history, checkpoint, key or rotation proof "
        "(docs/cli.md)",
        param_hint=option,
    )


def read_rotation_proof(path: Path | None) -> Any:
    """The rotation proof file's JSON (checked by the verifier), or None."""
    from audit.strict_json import strict_json

    if path is None:
        return None
    return strict_json(read_document(path, "--rotation-proof"), "rotation proof")


def register(app: typer.Typer) -> None:
    app.command("slice")(slice_command)
    app.command("export-subject")(export_subject)
    app.add_typer(erase_app, name="erase")
    app.add_typer(audit_app, name="audit")
    app.add_typer(keys_app, name="keys")


# ------------------------------------------------------------------------- slices


def slice_command(
    query: Annotated[str, typer.Argument(help="What the app is about to answer.")],
    app_id: Annotated[str, typer.Option("--app", help="The reading app (its policy applies).")],
    agent: Annotated[str, typer.Option(help="The reading agent (visibility applies).")],
    purpose: Annotated[str, typer.Option(help="Purpose of the read.")],
    budget: Annotated[int, typer.Option(help="Hard budget in cl100k tokens.")] = 512,
    subject: Annotated[str | None, typer.Option(help="Subject, named explicitly.")] = None,
    session: Annotated[str | None, typer.Option(help="Or a registered session id.")] = None,
    agent_type: Annotated[str, typer.Option(help="Type of the reading agent.")] = "",
    lexical: Annotated[bool, typer.Option(help="Lexical only (no query embedding).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full slice as JSON.")] = False,
) -> None:
    """Serve the profile slice an app may see for a query, within a token budget."""
    from uprof.facade import SubjectRequest

    with door() as d:
        # The operator reads as the app: the app's policy, consent and visibility apply.
        result = d.for_app(app_id).slice(
            SubjectRequest(subject=subject, session_id=session),
            query,
            budget_tokens=budget,
            purpose=purpose,
            agent_id=agent,
            agent_type=agent_type,
            lexical_only=lexical,
        )
        if as_json:
            console.print_json(json.dumps(slice_json(result)))
            return
        print_slice(result, title=f"{app_id} / {agent} / {purpose}")
        hint = empty_slice_hint(
            result.withheld,
            items=len(result.items),
            app_id=app_id,
            purpose=purpose,
            subject=subject,
        )
        if hint:
            console.print(f"[bold]hint:[/] {hint}", highlight=False)


def empty_slice_hint(
    withheld: Mapping[str, int], *, items: int, app_id: str, purpose: str, subject: str | None
) -> str | None:
    """Why an empty slice is empty, when the gate withheld what there was, and what to run."""
    if items or not withheld:
        return None
    steps = []
    if withheld.get("policy"):
        steps.append(
            f"no policy rule lets {app_id} read for purpose {purpose!r}: "
            f"see `uprof policy show`, or grant with `uprof policy grant`"
        )
    if withheld.get("consent"):
        who = f" --subject {subject}" if subject else ""
        steps.append(f"no consent covers purpose {purpose!r}: see `uprof consent list{who}`")
    return "; ".join(steps) or None


def slice_json(result: object) -> dict[str, object]:
    from dataclasses import asdict

    return asdict(result)  # type: ignore[call-overload,no-any-return]


def print_slice(result: object, *, title: str) -> None:
    r = result  # a ProfileSlice
    console.rule(f"[bold]slice[/] {title}: {r.n_tokens}/{r.budget_tokens} tokens")  # type: ignore[attr-defined]
    console.print(r.text or "[dim](empty)[/]", highlight=False)  # type: ignore[attr-defined]
    table = Table(title="items", title_justify="left", expand=True)
    for column in ("layer", "category", "label", "conf", "source refs", "evidence"):
        table.add_column(column, overflow="fold")
    for item in r.items:  # type: ignore[attr-defined]
        table.add_row(
            item.layer,
            item.category,
            item.provenance,
            f"{item.confidence:.2f}",
            ", ".join(item.source_refs) or "—",
            ", ".join(e[:8] for e in item.evidence),
        )
    console.print(table)
    withheld = ", ".join(f"{k}: {v}" for k, v in sorted(r.withheld.items())) or "none"  # type: ignore[attr-defined]
    reasons: dict[str, int] = {}
    for lo in r.left_out:  # type: ignore[attr-defined]
        reasons[lo.reason] = reasons.get(lo.reason, 0) + 1
    dropped = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())) or "none"
    console.print(f"withheld by the gate (counts only): {withheld}; left out: {dropped}")


# ------------------------------------------------------------------------ erasure


@erase_app.command("subject")
def erase_subject(
    subject: Annotated[str, typer.Option()],
    out: Annotated[
        Path | None,
        typer.Option(help="Write the signed receipt here.", callback=writable_file),
    ] = None,
    basis: Annotated[str, typer.Option(help="Legal basis.")] = "GDPR-Art.17(1)",
) -> None:
    """Erase a subject entirely and print (or save) the signed receipt."""
    with door() as d:
        print_receipt(console, d.erase_subject(subject, basis=basis), out)


@erase_app.command("event")
def erase_event(
    subject: Annotated[str, typer.Option()],
    capture: Annotated[str, typer.Option(help="Capture id of the event.")],
    out: Annotated[Path | None, typer.Option(callback=writable_file)] = None,
) -> None:
    """Erase one captured event and everything derived only from it."""
    with door() as d:
        print_receipt(console, d.erase_capture(subject, capture), out)


@erase_app.command("item")
def erase_item(
    subject: Annotated[str, typer.Option()],
    item: Annotated[str, typer.Option(help="Item id.")],
    with_evidence: Annotated[bool, typer.Option(help="Also erase the source events.")] = False,
    out: Annotated[Path | None, typer.Option(callback=writable_file)] = None,
) -> None:
    """Erase one item of the profile."""
    with door() as d:
        print_receipt(console, d.erase_item(subject, item, with_evidence=with_evidence), out)


@erase_app.command("settle-host")
def erase_settle_host(
    host: Annotated[str, typer.Argument(help="The host name its in-flight marks name.")],
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm that HOST is gone for good and runs nothing.")
    ] = False,
) -> None:
    """Settle the erasure requests left open by a host that will never start again
    (operator work, the `operate` right).

    A start settles only its own host's dead requests: a lock in a shared key folder
    may not reach other hosts, so from here an unheld lock proves nothing. Once you know
    HOST is gone (decommissioned, its container gone for good), this writes
    `erasure.abandoned` (reason_code host-gone, with who asked) for each request whose
    mark names HOST and that has no outcome and no ledger record. Refused for this host
    and while any of HOST's marks is locked; the subject's data stays as it was (ask for
    the erasure again)."""
    if not yes:
        err_console.print(
            f"settle-host declares {host!r} gone for good: a request still running there "
            "would end with two outcomes. Check it is, then run again with --yes."
        )
        raise typer.Exit(2)
    with door() as d:
        done = d.settle_erasures_of_host(host)
    if done.held:
        err_console.print(
            f"refused: {len(done.held)} erasure request(s) of {host!r} are locked by a "
            "running process, so that host is not gone; nothing was settled: "
            + ", ".join(done.held)
        )
        raise typer.Exit(1)
    console.print(
        f"settled {len(done.settled)} erasure request(s) of {host!r} as abandoned"
        + (": " + ", ".join(done.settled) if done.settled else "")
        + ("" if done.settled else " (none was open with a mark of that host)"),
        highlight=False,
    )


def export_subject(
    subject: Annotated[str, typer.Option()],
    out: Annotated[
        Path, typer.Option(help="Where to write the JSON export.", callback=writable_file)
    ],
) -> None:
    """Export everything held about a subject, with evidence (GDPR Art. 15/20)."""
    with door() as d:
        export = d.export_subject(subject)
    write_private(out, json.dumps(export, indent=2, ensure_ascii=False) + "\n")
    console.print(f"exported {len(export['captured_events'])} events to {out}")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), whatever the umask
    and whatever mode an earlier file there had: a new file beside it, created 0600,
    replaces it (a reader holding the old file open never sees the new text)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -------------------------------------------------------------------------- audit


@audit_app.command("export")
def audit_export(
    out: Annotated[
        Path, typer.Option(help="Output file (.jsonl or .csv).", callback=writable_file)
    ],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv")] = "jsonl",
    subject: Annotated[str | None, typer.Option(help="Only this subject.")] = None,
    app_id: Annotated[str | None, typer.Option("--app")] = None,
    action: Annotated[str | None, typer.Option()] = None,
    since: Annotated[str | None, typer.Option(help="RFC 3339, inclusive.")] = None,
    until: Annotated[str | None, typer.Option(help="RFC 3339, exclusive.")] = None,
) -> None:
    """Export the audit trail with inclusion proofs and a signed checkpoint."""
    if fmt not in ("jsonl", "csv"):
        raise typer.BadParameter("--format must be jsonl or csv")
    with door() as d:
        summary = d.export_audit(
            out,
            fmt=fmt,
            subject=subject,
            app_id=app_id,
            action=action,
            since=since,
            until=until,
        )
    # Words, not the summary's repr: the checkpoint is in the file's header line.
    console.print(
        f"exported {summary.entry_count} entries (tree size {summary.tree_size}) to {out}, "
        f"sha256 {summary.export_sha256}; check it offline with "
        f"`uprof audit verify {out} --public-key audit.pem`"
    )


@audit_app.command("entries")
def audit_entries(
    subject: Annotated[str | None, typer.Option(help="Only this subject (or pseudonym).")] = None,
    app_id: Annotated[str | None, typer.Option("--app", help="Only about this app.")] = None,
    action: Annotated[str | None, typer.Option(help="Only this action.")] = None,
    since: Annotated[str | None, typer.Option(help="RFC 3339, inclusive.")] = None,
    until: Annotated[str | None, typer.Option(help="RFC 3339, exclusive.")] = None,
    limit: Annotated[int | None, limit_option()] = None,
    cursor: Annotated[str | None, cursor_option()] = None,
) -> None:
    """List audit entries in leaf order, a page at a time (JSON; no proofs: see export)."""
    with door() as d:
        page = d.list_audit_entries(
            subject=subject,
            app_id=app_id,
            action=action,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )
        items = [{"leaf_index": e.leaf_index, "entry": e.entry} for e in page.items]
        print_page(items, page.next_cursor)


@audit_app.command("receipts")
def audit_receipts(
    limit: Annotated[int | None, limit_option()] = None,
    cursor: Annotated[str | None, cursor_option()] = None,
) -> None:
    """List the erasure receipts the log recorded, oldest first, a page at a time (JSON)."""
    with door() as d:
        page = d.list_receipts(cursor=cursor, limit=limit)
        items = [
            {
                "leaf_index": e.leaf_index,
                "recorded_at": e.recorded_at,
                "receipt_id": e.entry["receipt_id"],
                "receipt_sha256": e.entry["receipt_sha256"],
            }
            for e in page.items
        ]
        print_page(items, page.next_cursor)


@audit_app.command("public-key")
def audit_public_key(
    out: Annotated[Path, typer.Option(help="Write the PEM here.", callback=writable_file)],
) -> None:
    """Write the audit log's public key (all a verifier needs, with the origin)."""
    with door() as d:
        key = d.audit_public_key()
        out.write_text(key["public_key_pem"], encoding="ascii")
        console.print(f"public key written to {out}; origin: {key['origin']}")


@audit_app.command("keys")
def audit_keys(
    out: Annotated[
        Path, typer.Option(help="Write the key history (JSON) here.", callback=writable_file)
    ],
) -> None:
    """Write the audit key history: every public key the log signed with, each endorsed
    by the one before. Give it to verifiers with the first public key (--key-history)."""
    with door() as d:
        history = d.audit_key_history()
    if history is None:
        err_console.print("[bold red]this deployment keeps no audit key history[/]")
        raise typer.Exit(1)
    out.write_text(json.dumps(history, indent=1, sort_keys=True) + "\n", encoding="ascii")
    keys = history["keys"]
    console.print(
        f"key history of {len(keys)} key(s) written to {shown(out)}; current key "
        f"{keys[-1]['key_id'][:16]}…, first key {keys[0]['key_id'][:16]}…",
        highlight=False,
    )


@audit_app.command("rotate-key")
def audit_rotate_key(
    as_json: Annotated[bool, typer.Option("--json", help="Print the rotation as JSON.")] = False,
) -> None:
    """Make a new audit signing key current, endorsed by the current one (operator work,
    the `operate` right; recorded as audit.key_rotated). Exports, receipts and backups
    signed before still verify, with the key history (`uprof audit keys`)."""
    with door() as d:
        done = d.rotate_audit_key()
    if as_json:
        console.print_json(json.dumps(done))
        return
    # A sentence, as its neighbours say what they did; --json for scripts (bug WN).
    console.print(
        f"audit key rotated (rotation {done['seq']}): the log now signs with key "
        f"{done['key_id']}, endorsed by the previous key {done['previous_key_id']}; "
        "give verifiers the key history (`uprof audit keys --out FILE`) and take a backup "
        "now (one taken before restores only with --allow-unsigned)",
        highlight=False,
        soft_wrap=True,
    )


@audit_app.command("checkpoint")
def audit_checkpoint(
    out: Annotated[Path, typer.Option(help="Write the signed note here.", callback=writable_file)],
) -> None:
    """Sign and write a checkpoint of the log as it is now: keep it (or hand it to an
    auditor) to ask later for a proof that the log only grew since (`audit prove`)."""
    with door() as d:
        note = d.audit_checkpoint()
    out.write_text(note, encoding="utf-8", newline="")
    size = note.split("\n")[1]
    console.print(f"checkpoint of tree size {size} written to {shown(out)}", highlight=False)


@audit_app.command("verify")
def audit_verify(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    public_key: Annotated[Path, typer.Option(exists=True, help="The log's public key (PEM).")],
    origin: Annotated[str, typer.Option(help="The log's origin name.")] = "uprof.local/audit",
    trusted: Annotated[
        list[Path] | None,
        typer.Option(
            "--trusted-checkpoint",
            exists=True,
            dir_okay=False,
            help="A checkpoint note, or a receipt, received earlier: the trail must extend it.",
        ),
    ] = None,
    key_history: KeyHistoryFile = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="Check it is this tenant's (tenants on shared stores share a key)."),
    ] = None,
    rotation_proof: RotationProofFile = None,
) -> None:
    """Verify an exported trail offline, with only the public key (and the key history,
    for a trail signed by a key rotated in after the pinned one; a trail whose key was
    rotated out after it was exported also needs its --rotation-proof)."""
    from audit.errors import VerificationError
    from audit.verify import verify_export

    try:
        history = read_key_history(key_history)
        key = read_document(public_key, "--public-key")
        notes = [
            trusted_checkpoint(read_document(item, "--trusted-checkpoint"), key, origin, history)
            for item in trusted or []
        ]
        report = verify_export(
            path,
            key,
            origin,
            trusted_checkpoints=notes,
            key_history=history,
            tenant=tenant,
            rotation_proof=read_rotation_proof(rotation_proof),
        )
    except VerificationError as e:
        err_console.print(f"[bold red]verification failed:[/] {shown(e)}", highlight=False)
        raise typer.Exit(1) from None
    console.print(
        f"[green]verified[/]: {report.entry_count} entries, tree size {report.tree_size}, "
        f"format {report.format}, key {report.key_id[:16]}…"
        + (
            f", filtered on tenant {shown(json.dumps(report.filter['tenant']))}"
            if "tenant" in report.filter
            else ""
        )
        + (f", extends {len(notes)} trusted checkpoint(s)" if notes else "")
        + (
            f", passes through {report.rotation_points_checked} key rotation point(s)"
            if report.rotation_points_checked
            else ""
        )
        + (
            f"; {report.keys_unbounded} retired key(s) rotated out without a recorded point "
            "are trusted at any size (docs/audit-format.md §4.2)"
            if report.keys_unbounded
            else ""
        ),
        highlight=False,
    )


def shown(value: object) -> str:
    """Text from a file someone handed in, safe to print: Rich markup in it (``[/x]`` raises,
    ``[green]verified[/]`` would style a failure as success) is escaped, and characters that
    are not printable (terminal escape sequences, bidi overrides) are shown as ``\\uXXXX``."""
    from rich.markup import escape

    text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in str(value))
    return escape(text)


def read_key_history(path: Path | None) -> object:
    """A key history file, parsed strictly (verified by the verifier it is given to)."""
    from audit.keyring import parse_key_history

    return None if path is None else parse_key_history(read_document(path, "--key-history"))


def trusted_checkpoint(
    raw: bytes, public_key: bytes, origin: str, key_history: object = None
) -> str:
    """The checkpoint note of a file: the note itself, or a verified receipt's checkpoint."""
    from audit.errors import VerificationError
    from audit.keys import HELD_BY_READER
    from audit.receipts import parse_receipt, verify_receipt

    if raw.lstrip().startswith(b"{"):
        receipt = parse_receipt(raw)
        # The reader's own receipt, as their own note (bug ML): one issued before its key
        # was rotated out needs no rotation proof, since the trail must extend its tree.
        verify_receipt(
            receipt,
            public_key,
            origin=origin,
            key_history=key_history,
            rotation_proof=HELD_BY_READER,
        )
        return str(receipt["checkpoint"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VerificationError("a trusted checkpoint file is not UTF-8") from None


def held_checkpoint(raw: bytes) -> str | dict[str, object]:
    """A file someone holds: a checkpoint note (text), or a receipt (strict JSON), unverified."""
    from audit.errors import VerificationError
    from audit.receipts import parse_receipt

    if raw.lstrip().startswith(b"{"):
        receipt = parse_receipt(raw)
        if not isinstance(receipt, dict):
            raise VerificationError("a receipt file holds a JSON object")
        return receipt
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VerificationError("a checkpoint file is not UTF-8") from None


@audit_app.command("prove")
def audit_prove(
    out: Annotated[
        Path, typer.Option(help="Write the proof document (JSON) here.", callback=writable_file)
    ],
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from",
            exists=True,
            dir_okay=False,
            help="A checkpoint note or a receipt you hold: prove from its tree size "
            "(a receipt's entry is included too).",
        ),
    ] = None,
    old_size: Annotated[
        int | None, typer.Option(help="Or the old tree size itself (at least 1).")
    ] = None,
    leaf_index: Annotated[
        int | None, typer.Option(help="Also prove this entry is in the fresh checkpoint.")
    ] = None,
) -> None:
    """Prove the log only grew since an old checkpoint: a fresh signed checkpoint with the
    consistency proof (and an entry's inclusion proof), to check offline with verify-proof."""
    from audit.checkpoint import verify_checkpoint
    from audit.errors import VerificationError
    from audit.keyring import trusted_keys
    from audit.keys import HELD_BY_READER
    from audit.proofs import proof_bytes, verify_proof

    if (from_file is None) == (old_size is None):
        raise typer.BadParameter("give exactly one of --from and --old-size")
    held_raw = None if from_file is None else read_document(from_file, "--from")
    with door() as d:
        held: str | dict[str, object] | None = None
        check_against: str | dict[str, object] | None = None
        key = d.audit_public_key()
        if held_raw is not None:
            try:
                held = held_checkpoint(held_raw)
                if isinstance(held, dict):
                    from audit.receipts import ROTATION_POINT_CHECKED_BY_CALLER, verify_receipt

                    # A receipt issued before its key was rotated out needs no rotation
                    # proof here (bug MK): ``verify_proof`` below proves this log, to a
                    # checkpoint of its current key, extends the receipt's tree.
                    verify_receipt(
                        held,
                        key["public_key_pem"],
                        origin=key["origin"],
                        key_history=key["key_history"],
                        rotation_proof=ROTATION_POINT_CHECKED_BY_CALLER,
                    )
                    note = str(held["checkpoint"])
                    inclusion = held["inclusion"]
                    receipt_leaf = inclusion["leaf_index"] if isinstance(inclusion, dict) else None
                    leaf_index = receipt_leaf if leaf_index is None else leaf_index
                    # The receipt is checked whole when its own entry is the one included.
                    check_against = held if leaf_index == receipt_leaf else note
                else:
                    note = check_against = held
                pinned = trusted_keys(key["public_key_pem"], key["key_history"])
                # The operator's held note (checked against the log by the proof below)
                # and the log's fresh one: sizes only, no rotation proof needed.
                old_size = verify_checkpoint(
                    note, pinned, key["origin"], rotation_proof=HELD_BY_READER
                ).tree_size
                now = verify_checkpoint(d.audit_checkpoint(), pinned, key["origin"]).tree_size
            except VerificationError as e:
                err_console.print(
                    f"[bold red]--from is not a checkpoint of this log:[/] {shown(e)}",
                    highlight=False,
                )
                raise typer.Exit(1) from None
            if old_size > now:
                # This key signed a longer log than this one: not a bad size, the log
                # shrank (a log only grows), which is what --from is asked to detect.
                err_console.print(
                    f"[bold red]this log does not extend {shown(from_file)}:[/] it holds "
                    f"{now} entries, fewer than the {old_size} of that checkpoint, which "
                    "its key signed: the log was rolled back (put back from an older "
                    "copy) or forked",
                    highlight=False,
                )
                raise typer.Exit(1)
        assert old_size is not None
        document = d.prove_audit(old_size, leaf_index=leaf_index)
        out.write_bytes(proof_bytes(document))
        if check_against is not None:
            try:
                verify_proof(
                    document,
                    key["public_key_pem"],
                    key["origin"],
                    trusted=check_against,
                    key_history=key["key_history"],
                )
            except VerificationError as e:
                err_console.print(
                    f"[bold red]this log does not extend {shown(from_file)}:[/] {shown(e)} "
                    f"(proof written to {shown(out)})",
                    highlight=False,
                )
                raise typer.Exit(1) from None
    included = "" if leaf_index is None else f", entry {leaf_index} included"
    console.print(
        f"proof written to {shown(out)}: tree size {document['tree_size']} extends "
        f"{old_size}{included}",
        highlight=False,
    )


def _is_receipt(raw: bytes) -> bool:
    """Whether a file is a receipt (one JSON object with a ``body``), not an export, a
    proof document or a note (whose checkpoint the log checks)."""
    from audit.errors import VerificationError
    from audit.strict_json import strict_json

    try:
        parsed = strict_json(raw, "file")
    except VerificationError:
        return False
    return isinstance(parsed, dict) and "body" in parsed


@audit_app.command("rotation-proof")
def audit_rotation_proof(
    receipt: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    out: Annotated[
        Path,
        typer.Option(
            help="Write the rotation proof (a JSON list of base64 hashes) here.",
            callback=writable_file,
        ),
    ],
) -> None:
    """The rotation proof of a file signed before an audit key rotation (an erasure
    receipt, an export, a proof document or a checkpoint note): what verify-receipt,
    verify and verify-proof --key-history need beside it (--rotation-proof OUT)."""
    # A receipt, a proof document or a note is read whole; of a longer file (an export)
    # the first lines, which carry its checkpoint.
    raw = read_document(receipt, "RECEIPT", head=True)
    with door() as d:
        if _is_receipt(raw):
            proof = d.receipt_rotation_proof(raw)
            what = f"receipt {shown(proof['receipt_id'])}"
        else:
            proof = d.checkpoint_rotation_proof(raw)
            what = f"the checkpoint of size {proof['tree_size']} in {shown(receipt)}"
    if proof["rotation_proof"] is None:
        console.print(
            f"{what} needs no rotation proof: its key was not rotated out after its "
            "checkpoint (nothing written)",
            highlight=False,
        )
        return
    out.write_text(json.dumps(proof["rotation_proof"]) + "\n")
    console.print(
        f"rotation proof written to {shown(out)}: tree size {proof['tree_size']} to the "
        f"rotation point {proof['rotation_point']} of key {proof['issuer_key_id'][:16]}…",
        highlight=False,
    )


@audit_app.command("verify-proof")
def audit_verify_proof(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    public_key: Annotated[Path, typer.Option(exists=True, help="The log's public key (PEM).")],
    trusted: Annotated[
        Path,
        typer.Option(
            "--trusted-checkpoint",
            exists=True,
            dir_okay=False,
            help="The checkpoint note, or the receipt, you held before the proof.",
        ),
    ],
    origin: Annotated[str, typer.Option(help="The log's origin name.")] = "uprof.local/audit",
    key_history: KeyHistoryFile = None,
    rotation_proof: RotationProofFile = None,
) -> None:
    """Verify a proof document offline: the log only grew since the checkpoint you trusted
    (a document whose key was rotated out after it was made also needs --rotation-proof)."""
    from audit.errors import VerificationError
    from audit.proofs import verify_proof

    try:
        held = held_checkpoint(read_document(trusted, "--trusted-checkpoint"))
        report = verify_proof(
            read_document(path, "PATH"),
            read_document(public_key, "--public-key"),
            origin,
            trusted=held,
            key_history=read_key_history(key_history),
            rotation_proof=read_rotation_proof(rotation_proof),
        )
    except VerificationError as e:
        err_console.print(f"[bold red]proof does not verify:[/] {shown(e)}", highlight=False)
        raise typer.Exit(1) from None
    included = "" if report.leaf_index is None else f"; entry {report.leaf_index} is in it"
    console.print(
        f"[green]verified[/]: the log of size {report.tree_size} extends the trusted "
        f"checkpoint of size {report.old_size}{included} (key {report.key_id[:16]}…, "
        f"origin {shown(origin)})",
        highlight=False,
    )


@audit_app.command("verify-receipt")
def audit_verify_receipt(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    public_key: Annotated[Path, typer.Option(exists=True, help="The log's public key (PEM).")],
    origin: Annotated[str, typer.Option(help="The log's origin name.")] = "uprof.local/audit",
    subject: Annotated[str | None, typer.Option(help="Check it is this subject's...")] = None,
    nonce: Annotated[str | None, typer.Option(help="...with the nonce given at erasure.")] = None,
    key_history: KeyHistoryFile = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="Check it is this tenant's (tenants on shared stores share a key)."),
    ] = None,
    rotation_proof: RotationProofFile = None,
) -> None:
    """Verify an erasure receipt offline, with only the public key and the log's origin."""
    from audit.errors import VerificationError
    from audit.receipts import parse_receipt, verify_receipt, verify_subject_commitment

    try:
        subject_nonce = bytes.fromhex(nonce) if nonce is not None else None
    except ValueError:
        raise typer.BadParameter("--nonce must be the hex string given at erasure") from None
    if (subject is None) != (subject_nonce is None):
        raise typer.BadParameter("--subject and --nonce go together")
    try:
        receipt = parse_receipt(read_document(path, "PATH"))
        verify_receipt(
            receipt,
            read_document(public_key, "--public-key"),
            origin=origin,
            key_history=read_key_history(key_history),
            tenant=tenant,
            rotation_proof=read_rotation_proof(rotation_proof),
        )
        if subject is not None and subject_nonce is not None:
            verify_subject_commitment(receipt, subject, subject_nonce)
    except VerificationError as e:
        err_console.print(f"[bold red]receipt does not verify:[/] {shown(e)}", highlight=False)
        raise typer.Exit(1) from None
    body = receipt["body"]
    console.print(
        f"[green]receipt verified[/]: {shown(body['receipt_id'])} issued "
        f"{shown(body['issued_at'])} by {shown(origin)} for tenant "
        f"{shown(json.dumps(body['subject']['tenant']))}, {len(body['actions'])} actions, "
        f"scope {shown(json.dumps(body['request']['scope']))}"
        + (", subject matches" if subject is not None else ""),
        highlight=False,
    )


@audit_app.command("residue")
def audit_residue(
    term: Annotated[list[str], typer.Option(help="A string the erased subject's data held.")],
    backups: Annotated[
        list[Path] | None,
        typer.Option(
            "--backups",
            help="A folder backups are written to (uprof backup --to <folder>/<name>): "
            "report the partial backup folders in it.",
        ),
    ] = None,
) -> None:
    """Scan every store for the terms and for decryptable data of erased subjects."""
    with door() as d:
        # The backup folders first: one that is not a folder is refused (exit 2) before
        # the long scan (bug LD).
        found = d.partial_backups(backups or [])
        report = d.residue_scan(term)
    console.print(
        f"scanned {report.files_scanned} files ({report.bytes_scanned} bytes), "
        f"{report.tables_scanned} tables, {report.streams_checked} erased streams "
        f"({report.events_checked} events)"
    )
    # A backup folder is outside the data folder (uprof backup refuses one inside), so
    # the scan above never reads it; what a killed backup left there is a copy of the
    # stores outside the backup set (bug KI). Listed, not read: its files are the
    # stores' own bytes, under the subjects' keys.
    left = []
    for partial in found:
        if partial.being_written:
            console.print(
                f"partial backup {partial.path}: being written by a live process",
                soft_wrap=True,  # a path folded across lines is not one to copy
                highlight=False,
            )
        else:
            left.append(partial.path)
    if report.clean and not left:
        console.print("[green]residue: 0[/]")
        return
    for finding in report.findings:
        # An erasure's state first: "remain" of a running one is gone when it ends (PS).
        state = f" [{finding.erasure}]" if finding.erasure else ""
        console.print(
            f"[red]{finding.kind}[/]{escape(state)} at {finding.location}: {finding.detail}",
            soft_wrap=True,
            highlight=False,
        )
    for path in left:
        console.print(
            f"[red]partial-backup[/] at {path}: left by a killed uprof backup, a copy of the "
            "stores; the next uprof backup into that folder removes it",
            soft_wrap=True,
            highlight=False,
        )
    raise typer.Exit(1)


@keys_app.command("rotate")
def keys_rotate(
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Re-wrap every data key under a new KEK epoch and forget the old KEK."""
    with door() as d:
        done = d.rotate_keys()
    if as_json:
        console.print_json(json.dumps(done))
        return
    # A sentence, as `audit rotate-key` says what it did; --json for scripts (bug XE).
    console.print(
        f"data keys re-wrapped under KEK epoch {done['epoch']}: {done['deks_rewrapped']} "
        f"data keys, {done['epochs_forgotten']} old KEK epoch(s) forgotten",
        highlight=False,
        soft_wrap=True,
    )
