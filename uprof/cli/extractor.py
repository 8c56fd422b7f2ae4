"""``uprof extractor check``: validate an OpenAI-compatible endpoint with one call.

The check builds the same LLM extractor the pipeline builds (``UPROF_LLM_*``
settings, or the options here), but without the rule fallback, and asks it to
extract one fixed sentence. It reports what came back, or why nothing did, and
exits 1 on failure, so it fits a deployment script. No profile data is read or
written: nothing but the fixed sentence leaves the machine.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Annotated

import typer

from uprof.bounds import LLM_TIMEOUT_MAX_S
from uprof.cli.context import CheckedTyper, console, err_console, settings

extractor_app = CheckedTyper(no_args_is_help=True, help="Check the configured extractor.")

#: A sentence with two plain facts: a working endpoint should propose something for it.
PROBE = "I am vegetarian and I live in Porto with my two cats."


@extractor_app.command("check")
def check(
    base_url: Annotated[
        str | None,
        typer.Option(help="API root, e.g. http://127.0.0.1:11434/v1 (UPROF_LLM_BASE_URL)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name (UPROF_LLM_MODEL).")] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds to wait for the answer, up to 3600 (UPROF_LLM_TIMEOUT_S).",
            # As the setting's bounds: 1e309 ended in an OverflowError traceback (WP).
            min=0.001,
            max=LLM_TIMEOUT_MAX_S,
        ),
    ] = None,
) -> None:
    """Send one extraction request to the model endpoint and report the outcome."""
    from domain.values import CapturedInteraction, Interaction
    from uprof.adapters.extraction import OpenAICompatibleExtractor
    from uprof.adapters.extraction.errors import ExtractionError

    config = settings()
    url = base_url or config.llm_base_url
    name = model or config.llm_model
    key = config.llm_api_key.get_secret_value() if config.llm_api_key else None
    try:
        extractor = OpenAICompatibleExtractor(
            url, name, key, timeout_s=timeout_s or config.llm_timeout_s
        )
    except ValueError as bad:
        err_console.print(f"[bold red]error:[/] {bad}", highlight=False)
        raise typer.Exit(2) from None
    capture = CapturedInteraction(
        "extractor-check",
        Interaction(
            app_id="app:extractor-check",
            agent_id="check",
            occurred_at=datetime.now(UTC),
            user_input=PROBE,
        ),
    )
    began = time.perf_counter()
    try:
        with extractor:
            batch = extractor.extract(capture)
    except ExtractionError as failed:
        err_console.print(f"[bold red]endpoint check failed:[/] {failed}", highlight=False)
        advice = (
            "the server may recover: retry later"
            if failed.retryable
            else "fix the base URL, model name or API key"
        )
        err_console.print(f"({advice})", highlight=False)
        raise typer.Exit(1) from None
    elapsed_ms = (time.perf_counter() - began) * 1000.0
    kinds = Counter(type(p).__name__ for p in batch.proposals)
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "no proposals"
    console.print(f"endpoint {url} model {name}: answered in {elapsed_ms:.0f} ms; {summary}")
    if batch.extras.get("dropped", "0") not in ("", "0"):
        console.print(f"items the model returned that failed validation: {batch.extras['dropped']}")


def register(app: typer.Typer) -> None:
    app.add_typer(extractor_app, name="extractor")
