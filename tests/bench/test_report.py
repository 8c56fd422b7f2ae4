"""Markdown output: sections are replaced in place, surrounding text survives."""

from __future__ import annotations

from pathlib import Path

from benchmarks.report import table, write_markdown_section


def test_sections_replace_only_themselves(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "benchmarks.md"
    write_markdown_section(doc, "locomo", "first locomo")
    doc.write_text("# Benchmarks\n\nIntro.\n\n" + doc.read_text() + "\nHand-written notes.\n")
    write_markdown_section(doc, "prefeval", "prefeval table")
    write_markdown_section(doc, "locomo", "second locomo")
    text = doc.read_text()
    assert "first locomo" not in text
    assert text.count("second locomo") == 1 and text.count("prefeval table") == 1
    assert text.startswith("# Benchmarks\n\nIntro.\n")
    assert "Hand-written notes." in text
    assert (
        text.index("second locomo")
        < text.index("Hand-written notes.")
        < text.index("prefeval table")
    )


def test_table_formats_numbers_and_blanks() -> None:
    got = table(["a", "b", "c"], [["x", 0.12345, float("nan")], ["y", None, 3]])
    assert got.splitlines() == [
        "| a | b | c |",
        "|---|---|---|",
        "| x | 0.123 |  |",
        "| y |  | 3 |",
    ]
