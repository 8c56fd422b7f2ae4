"""docs/cli.md's exit-code table is the CLI's ``EXIT_CODES`` (review of 0198-0200, bug PZ).

Until then docs/cli.md listed exit codes 2 to 6 in a sentence; 1 and 0199's new 7
(stored data damaged) were not in it, and nothing compared the two. The table is read
from the document (rows ``| exit | meaning | errors |`` with the error classes in
backticks) and must name exactly the classes ``EXIT_CODES`` maps to each code, in the
order they are matched (a subclass listed before its base class).
"""

from __future__ import annotations

import re
from pathlib import Path

from uprof.cli.context import EXIT_CODES

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
ROW = re.compile(r"^\| (\d+) \| [^|]+ \|([^|]*)\|$")


def _documented() -> list[tuple[int, list[str]]]:
    rows = []
    for line in CLI_MD.read_text(encoding="utf-8").splitlines():
        found = ROW.match(line.strip())
        if found:
            rows.append((int(found.group(1)), re.findall(r"`(\w+)`", found.group(2))))
    return rows


def test_pz_the_exit_code_table_names_every_code_and_class_of_exit_codes() -> None:
    """Bug PZ. main at 8c1c0862: docs/cli.md has no such table (its sentence left out 1
    and 7)."""
    rows = _documented()
    codes = [code for code, _ in rows]
    assert codes == sorted(set(codes)), f"one row per exit code, in order: {codes}"
    assert codes[:1] == [0], "the table starts with 0, done"
    documented = {code: names for code, names in rows if code != 0}
    expected: dict[int, list[str]] = {}
    for cls, code in EXIT_CODES:
        expected.setdefault(code, []).append(cls.__name__)
    assert documented == expected


def test_held_exit_codes_match_subclasses_before_their_bases() -> None:
    """Held: every class in ``EXIT_CODES`` is reachable (no earlier row is a base class of
    it), so the documented code is the one a command exits with."""
    for i, (cls, _) in enumerate(EXIT_CODES):
        shadowing = [earlier.__name__ for earlier, _ in EXIT_CODES[:i] if issubclass(cls, earlier)]
        assert not shadowing, f"{cls.__name__} is matched first by {shadowing}"
