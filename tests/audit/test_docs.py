"""The Python examples in docs/audit-format.md run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit-format.md"


def test_python_examples_in_the_audit_format_doc_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
    assert capsys.readouterr().out.strip().endswith("1 1 False")
