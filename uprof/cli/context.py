"""Shared CLI plumbing: settings from options, one kernel per command, error mapping."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer._click.core import Command as ClickCommand
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandFunctionType

from domain.errors import (
    ConcurrencyConflictError,
    ConsentNotFoundError,
    ConsentRequiredError,
    DeploymentNotFoundError,
    ErasureIncompleteError,
    ErasureRolledBackError,
    EvidenceError,
    IdentityError,
    InvalidInputError,
    PermissionDeniedError,
    StoredDataDamagedError,
    SubjectErasedError,
    SubjectNotFoundError,
    UprofError,
)
from domain.principal import Principal
from domain.values import check_sharing, text_problem

if TYPE_CHECKING:
    # The context click hands a command's parse (typer bundles its own click).
    from pydantic import BaseModel
    from typer._click.core import Context as ClickContext

    # The kernel and the facade load when a command opens the stores, not when the CLI
    # starts: `uprof --help` and a refused option need neither.
    from uprof.facade import Facade
    from uprof.kernel import Uprof
    from uprof.settings import Settings

console = Console()
err_console = Console(stderr=True)

#: Exit codes by error class; the first match wins (subclasses before bases).
EXIT_CODES: tuple[tuple[type[UprofError], int], ...] = (
    (InvalidInputError, 2),
    (ConsentRequiredError, 3),
    (PermissionDeniedError, 3),
    (EvidenceError, 4),
    (IdentityError, 4),
    (ConsentNotFoundError, 5),
    (SubjectNotFoundError, 5),
    (SubjectErasedError, 5),
    (ConcurrencyConflictError, 6),
    (ErasureIncompleteError, 6),
    (ErasureRolledBackError, 6),
    # Stored data damaged or missing (a store put back, a table dropped): an operator
    # restores it; retrying does not help, unlike the outage's 1 (bug PX).
    (StoredDataDamagedError, 7),
    # A command that reads a deployment sent where none is (bug WM): the place is wrong,
    # not the input, nor the stores.
    (DeploymentNotFoundError, 8),
    (UprofError, 1),
)


def _refuse_unkept_text(command: ClickCommand, ctx: ClickContext, args: list[str]) -> None:
    """Refuse (``typer.BadParameter``, exit 2, naming it) the first option or argument of
    ``command`` given a value no store, file name or message can hold: a NUL character or
    a byte that is not UTF-8 (a lone surrogate once Python reads the command line),
    ``domain.values.text_problem``, the REST edge's rule. Checked on the values as typed,
    before any type conversion, callback or command runs: most options handed such a
    value to the command, where a lone surrogate raised ``UnicodeEncodeError`` wherever
    it was first encoded (``--data-dir``, ``export-subject --out``: a traceback; bug OJ),
    and 0181/0184 had guarded the others one by one. Paths too: a file name
    that is not UTF-8 is refused rather than half-handled (a SQLite path, a message, a
    manifest cannot carry it). The parse is done once more by ``parse_args``: a command
    line is short, and this way no option is parsed by anything but click."""
    if ctx.resilient_parsing:  # shell completion: click's own conversions are lenient there
        return
    opts, _, _ = command.make_parser(ctx).parse_args(args=list(args))
    for param in command.get_params(ctx):
        for value in _typed_values(opts.get(param.name or "")):
            problem = text_problem(value)
            if problem:
                # Named as click names a parameter it refuses ('--text', or an argument's name).
                name = param.opts[0] if param.opts else (param.name or "")
                raise typer.BadParameter(problem, ctx=ctx, param_hint=f"'{name}'")


def _typed_values(given: Any) -> Iterator[str]:
    """The strings of one parameter as the parser left them (one, or a list for a
    repeated option or several arguments, possibly nested)."""
    if isinstance(given, str):
        yield given
    elif isinstance(given, list | tuple):
        for item in given:
            yield from _typed_values(item)


def _outage_answered(error: Exception) -> None:
    """Exit as ``fail`` does when ``error`` is the database not answering (``store_outage``,
    the one rule REST, MCP and the SDK answer 503 ``store_unavailable`` by), or a SQLite
    store damaged (``store_damage``, exit 7: bug QH; a table of the wrong shape too,
    0214-store-damage-in-servers): ``store_refusal``; re-raise any
    other error. Every command that opened the stores let the driver's error out: a
    traceback ending in its text (on PostgreSQL the host, port and database), where every
    other refusal is a line and its hint (review of 0186 and 0188, bug OW)."""
    if "sqlalchemy" not in sys.modules:
        raise error  # no store was opened: not the database (and `--help` stays light)
    from uprof.api.errors import store_refusal

    refusal = store_refusal(error)
    if refusal is None:
        raise error
    fail(refusal)


class NamedFileError(InvalidInputError):
    """The system refused a file or folder the command was given (``_named_file_refused``):
    bad input, exit 2, with a hint that does not claim nothing was done."""

    hint = (
        "correct that path and run the command again; what the command did before the "
        "file was refused stands"
    )


def _named_file_refused(ctx: ClickContext, error: Exception) -> None:
    """Exit 2 naming the option (``fail``, ``InvalidInputError``) when ``error`` is the
    system refusing a file or folder an option or argument of the command named, or a
    file inside it: an ``--out`` that is a folder, in a folder that does not exist or
    with a name too long, a ``backup --to`` that is a file. Each ended in the OSError's
    traceback, the file's name last (bug WO). Only paths the command was given are
    matched: a store's own file failing is not the caller's input."""
    if not isinstance(error, OSError) or error.filename is None:
        return
    failed = [
        os.path.abspath(os.fsdecode(name))
        for name in (error.filename, error.filename2)
        if isinstance(name, str | bytes)
    ]
    for param in ctx.command.params:
        for given in _given_paths(ctx.params.get(param.name or "")):
            named = os.path.abspath(given)
            if any(f == named or f.startswith(named.rstrip(os.sep) + os.sep) for f in failed):
                option = param.opts[0] if param.opts else (param.name or "")
                reason = error.strerror or type(error).__name__
                fail(NamedFileError(f"{option} {escape(str(given))}: {reason}", field=option))


def _given_paths(value: Any) -> Iterator[Path]:
    """The paths among one parameter's converted value (one, or a list of them)."""
    if isinstance(value, Path):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _given_paths(item)


class _Checked(ClickCommand):
    """What a checked command and a checked group share: text no store keeps is refused in
    any of its options (``_refuse_unkept_text``), and the database not answering is a
    refusal (``_outage_answered``)."""

    def parse_args(self, ctx: ClickContext, args: list[str]) -> list[str]:
        _refuse_unkept_text(self, ctx, args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as error:
            _outage_answered(error)
            raise  # not reached: _outage_answered exits or re-raises


class CheckedCommand(_Checked, TyperCommand):
    """A command whose options and outages are checked (``_Checked``), and whose files
    the system refuses are named as its options (``_named_file_refused``)."""

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as error:
            _named_file_refused(ctx, error)
            raise


class CheckedGroup(_Checked, TyperGroup):
    """A command group whose own options are checked; its commands are
    ``CheckedCommand``s (``CheckedTyper``). Whatever command of it runs, the database not
    answering is a refusal: ``uprof serve``, ``worker``, ``mcp`` and ``restore`` open the
    stores their own way, and are answered here too."""


class CheckedTyper(typer.Typer):
    """``typer.Typer`` whose group and commands are checked ones: every ``uprof`` command
    group, the plugins' included, is one (a test walks the tree and says so), so no
    option of any command can take a NUL or a byte that is not UTF-8 (bug OJ)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", CheckedGroup)
        super().__init__(**kwargs)

    def command(
        self, *args: Any, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        kwargs.setdefault("cls", CheckedCommand)
        return super().command(*args, **kwargs)


class CliState:
    """Options given before the command name."""

    data_dir: Path | None = None
    key_dir: Path | None = None
    database_url: str | None = None
    embedder: str | None = None


STATE = CliState()

ModelT = TypeVar("ModelT", bound="BaseModel")


def settings() -> Settings:
    # The settings' model (pydantic-settings, ~0.1 s) loads when a command reads them,
    # not for `uprof --help` (0249-cli-start-cost).
    from pydantic import ValidationError

    from uprof.settings import Settings

    overrides: dict[str, object] = {}
    if STATE.data_dir is not None:
        overrides["data_dir"] = STATE.data_dir
    if STATE.key_dir is not None:
        overrides["key_dir"] = STATE.key_dir
    if STATE.database_url is not None:
        overrides["database_url"] = STATE.database_url
    if STATE.embedder is not None:
        overrides["embedder"] = STATE.embedder
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        # Each problem names its setting as it is set (UPROF_<FIELD>): two settings may
        # refuse the same text (the two rate limits), and a bare message names neither.
        problems = "; ".join(
            f"UPROF_{str(err['loc'][0]).upper()}: {err['msg']}" if err["loc"] else str(err["msg"])
            for err in e.errors()
        )
        err_console.print(f"[bold red]error:[/] configuration: {problems}", highlight=False)
        raise typer.Exit(2) from None


@contextmanager
def kernel(*, creates: bool = False) -> Iterator[Uprof]:
    """Open the deployment for one command and map uprof errors to exit codes.

    ``creates``: the command starts a deployment where there is none (``uprof init``,
    ``apps create``, a capture: its work is the deployment's first data). Any other
    command reads or changes an existing one, and is refused a data folder or database
    holding none (``DeploymentNotFoundError``, exit 8), before anything is made there
    (bug WM)."""
    from uprof.bootstrap import bootstrap

    k = None
    try:
        chosen = settings()
        # Asked first by the start, through the engine its stores then use
        # (0249-cli-start-cost): a reader refuses a place holding no deployment; a
        # creator, a database the server does not have, before the start makes the key
        # folder, not told as an outage after (bug XC).
        k = bootstrap(chosen, deployment="may_make" if creates else "required")
        yield k
    except UprofError as e:
        fail(e)
    finally:
        if k is not None:
            k.close()


@contextmanager
def door(*, creates: bool = False) -> Iterator[Facade]:
    """The authorized facade, as the local operator (``creates``: as ``kernel``'s).

    Whoever can run this command can read the data and key stores, so the CLI is the
    operator (``operator:local``): the policy's ``operators`` rows still decide what
    an operator may do, every call is audited as ``operator:local#cli``, and a
    command that acts for an app (``--app``) is decided by that app's policy.
    """
    from uprof.facade import Facade

    with kernel(creates=creates) as k:
        yield Facade(k, Principal.local_operator(k.subjects.tenant))


def _what_stopped(error: UprofError) -> UprofError:
    """``error``, or, for a policy check that could not consult its store (a denial
    carrying the store's error), that error: the command exits as the store's state says
    (7 damaged, 1 unreadable) with its hint, not 3 as refused by the policy with "ask the
    operator". A policy table emptied (rows removed) exited 3 so (bug QG)."""
    from policies.authorizer import PolicyDeniedError

    if isinstance(error, PolicyDeniedError) and error.decision.store_error is not None:
        return error.decision.store_error(str(error))
    return error


def fail(error: UprofError) -> None:
    from uprof.backends import SchemaLockWaitStopped

    error = _what_stopped(error)

    if isinstance(error, SchemaLockWaitStopped) and error.signal_number is not None:
        # SIGTERM or SIGINT while the start waited for a schema lock (bug OA): a stop,
        # not a failure; the exit status a shell gives a process the signal ended (the
        # command did not do its work). The servers exit 0 instead (``stopped_early``).
        stopped_early("uprof", error)
        raise typer.Exit(128 + error.signal_number)
    err_console.print(f"[bold red]error:[/] {error.diagnostics()}", highlight=False)
    code = next(code for cls, code in EXIT_CODES if isinstance(error, cls))
    raise typer.Exit(code)


def stopped_early(command: str, error: UprofError) -> None:
    """Say that ``command`` stopped as asked while its start waited for a schema lock
    (``SchemaLockWaitStopped``), having changed nothing."""
    err_console.print(f"{command} stopped before it started: {error}", highlight=False)


def built_from_options(model: type[ModelT], options: Mapping[str, str], **fields: object) -> ModelT:
    """``model`` (a request schema) built from a command's options. A value the schema
    refuses (one a store cannot keep, such as a byte that is not UTF-8, which Python
    reads as a lone surrogate; one too long) is bad input naming the option that gave
    it, exit 2, not pydantic's traceback naming the schema's field (review of 0181, bug
    NT). ``options`` maps the schema's field names to their options."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        option = options.get(name, name)
        fail(InvalidInputError(f"{option}: {first['msg']}", field=option))
        raise  # fail() exits; kept for the type checker


def parse_time(value: str | None, option: str) -> datetime | None:
    """Parse an ISO 8601 time given on the command line; it must carry a timezone."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        err_console.print(
            f"[bold red]error:[/] {option} {value!r} is not an ISO 8601 time with a zone, "
            f"for example {option} 2026-12-01T09:30:00Z or {option} 2026-12-01T10:30:00+01:00",
            highlight=False,
        )
        raise typer.Exit(2) from None
    if parsed.tzinfo is None:
        err_console.print(
            f"[bold red]error:[/] {option} needs a timezone, e.g. {value}Z", highlight=False
        )
        raise typer.Exit(2)
    return parsed


def writable_file(value: Path | None) -> Path | None:
    """Typer callback of an option naming a file the command writes: refused (exit 2,
    naming the option) before the command does anything when it cannot be one: a folder,
    in a folder that does not exist, a name longer than the file system takes. An
    erasure's ``--out`` found so only after the erasure was done: its receipt was lost to
    a traceback (bug WO); ``_named_file_refused`` names what is found later (the file
    system full, no right to write there)."""
    if value is None:
        return None
    try:
        if value.is_dir():
            raise typer.BadParameter(f"{value} is a folder: name a file in it")
        folder = value.parent
        if not folder.is_dir():
            missing = "is not a folder" if folder.exists() else "does not exist"
            raise typer.BadParameter(f"{value}: {folder} {missing}")
        limit = os.pathconf(folder, "PC_NAME_MAX")
        if len(os.fsencode(value.name)) > limit:
            raise typer.BadParameter(f"{value}: a file name is at most {limit} bytes here")
    except OSError as error:
        raise typer.BadParameter(f"{value}: {error.strerror or type(error).__name__}") from None
    return value


def sharing_option(value: str) -> str:
    """Typer callback: refuse a malformed ``--sharing`` before anything is written."""
    try:
        return check_sharing(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def is_interactive() -> bool:
    return sys.stderr.isatty()


def print_page(items: Sequence[Mapping[str, object]], next_cursor: str | None) -> None:
    """Print one page of a list as JSON ``{"items": [...], "next_cursor": ...}``; say on
    stderr how to get the next page, so a script reading stdout sees only the JSON."""
    import json

    console.print_json(json.dumps({"items": items, "next_cursor": next_cursor}, default=str))
    if next_cursor is not None:
        err_console.print(
            f"more: repeat with --cursor {next_cursor}", highlight=False, soft_wrap=True
        )


def limit_option() -> object:
    return typer.Option(
        "--limit", min=1, max=500, help="Most items on this page (1-500, default 100)."
    )


def port_option(help: str) -> object:
    """A TCP port: 0 (one the system picks) to 65535. Past it, the address lookup took
    the number modulo 65536 (``--port 70000`` served on 4464 while saying 70000) and a
    negative one ended as a server that could not start, exit 3 (bug RX): bad input."""
    return typer.Option("--port", min=0, max=65535, help=help)


def cursor_option() -> object:
    return typer.Option(
        "--cursor", help="Continue after the previous page (its next_cursor, same filters)."
    )
