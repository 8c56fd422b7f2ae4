"""Decision references resolve: helpers write a new record as ``XXXX-<slug>.md`` and the
merge renumbers it; a reference the renumbering missed ("decision XXXX") or one naming a
record that does not exist sends a reader nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEARCHED = (
    "README.md",
    "docs",
    "uprof",
    "domain",
    "projections",
    "policies",
    "audit",
    "migrations",
    "benchmarks",
    "tests",
)
# "decision XXXX", "decisions 0195, XXXX" (a list ending in the placeholder), "XXXX-slug".
PLACEHOLDER = re.compile(
    r"\b[Dd]ecisions? XXXX\b|\b\d{4}(?:,| and) XXXX\b|\bXXXX-[a-z]|^# XXXX", re.MULTILINE
)
# "0185-bridges-einsum-on-every-cpu", with or without ".md"; a date ("2026-12-06") has no letter.
NAMED_RECORD = re.compile(r"(?<![\w.-])\d{4}-[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")


def _texts() -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    for name in SEARCHED:
        top = ROOT / name
        files = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in files:
            if path.suffix in {".md", ".py"} and path.is_file() and path != Path(__file__):
                found.append((path, path.read_text(encoding="utf-8")))
    return found


def test_no_unnumbered_decision_reference_is_left() -> None:
    left = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for path, text in _texts()
        for m in PLACEHOLDER.finditer(text)
    ]
    assert left == []


def test_every_record_named_by_file_exists() -> None:
    records = {p.stem for p in (ROOT / "docs" / "decisions").glob("*.md")}
    named = [(path, m.group(0)) for path, text in _texts() for m in NAMED_RECORD.finditer(text)]
    # The folder and the references were found: the check below is not vacuous.
    assert len(records) > 100 and len(named) > 100
    missing = sorted(
        f"{path.relative_to(ROOT)}: {name}" for path, name in named if name not in records
    )
    assert missing == []
