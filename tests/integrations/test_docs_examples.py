"""The examples of docs/integrations.md run as they stand, against an embedded client."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from uprof.kernel import Uprof
from uprof.sdk import Client

pytest.importorskip("langchain_core")
pytest.importorskip("agents")

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_every_python_example_of_the_integrations_page_runs(
    kernel: Uprof, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first example builds a throwaway deployment; the kernel fixture stands in for it.
    setup, *examples = _examples()
    assert "Client.embedded" in setup and len(examples) == 2
    kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    client = Client.embedded(kernel, "app:planner")
    scope: dict[str, object] = {"client": client}
    for example in examples:
        exec(compile(example, str(DOC), "exec"), scope)
    printed = capsys.readouterr().out
    assert "jazz" in printed and "explicit" in printed  # the retriever found the turn
    assert {t.name for t in scope["tools"]} == {"profile_slice", "capture", "forget"}  # type: ignore[attr-defined]
