"""``uprof models``: install and check the embedding models that no package installs.

``fetch`` is an install step, like ``pip install``: it downloads (through pip, so the
machine's index settings apply), and it is the only command that does. Servers,
workers and every other command only read an installed folder (decision 0049).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from uprof.cli.context import CheckedTyper, console, err_console, settings

if TYPE_CHECKING:
    from uprof.adapters.models import ModelSpec

models_app = CheckedTyper(no_args_is_help=True, help="Install and check embedding models.")

_NAME_HELP = "The UPROF_EMBEDDER value of the model: mpnet."
_DIR_HELP = "Where models live (UPROF_MODELS_DIR; default ~/.cache/uprof/models)."


def _spec(name: str) -> ModelSpec:
    from uprof.adapters.models import MODELS

    spec = MODELS.get(name)
    if spec is None or not spec.parts:
        fetchable = ", ".join(k for k, s in MODELS.items() if s.parts)
        err_console.print(
            f"[bold red]error:[/] name: {name!r} is not a model to fetch (one of: {fetchable};"
            " minilm comes with the package)",
            highlight=False,
        )
        raise typer.Exit(2)
    return spec


def _models_dir(option: Path | None) -> Path:
    from uprof.adapters.models import default_models_dir

    return option or settings().models_dir or default_models_dir()


@models_app.command("fetch")
def fetch(
    name: Annotated[str, typer.Argument(help=_NAME_HELP)],
    models_dir: Annotated[Path | None, typer.Option(help=_DIR_HELP)] = None,
) -> None:
    """Download, verify (SHA-256 of every file) and install a model; a verified
    installed copy is kept as it is."""
    from domain.errors import ModelUnavailableError
    from uprof.adapters.models import fetch as fetch_model

    spec = _spec(name)
    try:
        folder = fetch_model(spec, _models_dir(models_dir))
    except ModelUnavailableError as e:
        err_console.print(f"[bold red]error:[/] {e.diagnostics()}", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"{spec.name} ({spec.dimension} dimensions) verified at {folder}", soft_wrap=True)


@models_app.command("verify")
def verify(
    name: Annotated[str, typer.Argument(help=_NAME_HELP)],
    models_dir: Annotated[Path | None, typer.Option(help=_DIR_HELP)] = None,
) -> None:
    """Check an installed model's files against the pinned hashes; exit 1 if any differ."""
    from uprof.adapters.models import model_folder
    from uprof.adapters.models import verify as verify_model

    spec = _spec(name)
    folder = model_folder(spec, _models_dir(models_dir))
    problems = verify_model(spec, folder)
    for problem in problems:
        err_console.print(f"{folder}: {problem}", highlight=False)
    if problems:
        raise typer.Exit(1)
    console.print(f"{spec.name}: every file matches its pinned SHA-256 at {folder}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
