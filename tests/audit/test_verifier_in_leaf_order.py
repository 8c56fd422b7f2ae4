"""The verifier checks an export's inclusion proofs in leaf order (``IncreasingInclusions``,
decision 0254-audit-verifier-cost): every change to a trail is refused as the full check of
each line's proof refused it, with the same reason, line and leaf; and the kinds of change a
reviewer of a handed-in trail asks about are each refused, naming the line."""

from __future__ import annotations

import base64
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from audit import verify
from audit._codec import b64decode_strict
from audit.errors import VerificationError
from audit.export import export_csv, export_jsonl
from audit.log import AuditLog
from audit.merkle import HASH_SIZE, IncreasingInclusions, verify_inclusion
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN
from tests.audit.test_export import MUTATIONS, export_lines
from tests.audit.test_log import fill


def _full_check(self: IncreasingInclusions, leaf: bytes, index: int, proof: Any) -> bool:
    """What the verifier did before: every line's proof decoded and hashed to the root."""
    try:
        hashes = [b64decode_strict(text, "hash", size=HASH_SIZE) for text in proof]
        verify_inclusion(leaf, index, self._size, hashes, self._hashes[0])
    except VerificationError:
        return False
    return True


def _strict_entry(verifier: Any, line: str, number: int) -> None:
    """What the verifier did before: every entry line read by ``strict_json`` first."""
    verify._jsonl_entry(verifier, verify._strict_json(line, number), line, number)


def _verdict(lines: list[bytes], key: object) -> tuple[str, int | None, int | None]:
    try:
        verify_export(lines, key, ORIGIN)  # type: ignore[arg-type]
    except VerificationError as exc:
        return str(exc), exc.line_number, exc.leaf_index
    return "verified", None, None


def _trials(lines: list[bytes], count: int, seed: int) -> Iterator[list[bytes]]:
    rng = random.Random(seed)
    for _ in range(count):
        mutated, _kind = rng.choice(MUTATIONS)(rng, lines)
        yield [line if line.endswith(b"\n") else line + b"\n" for line in mutated]


@pytest.mark.parametrize("filtered", [False, True], ids=["whole", "filtered"])
def test_every_change_is_refused_as_strict_reading_and_the_full_check_refused_it(
    sqlite_log: AuditLog, monkeypatch: pytest.MonkeyPatch, filtered: bool
) -> None:
    # 70 entries: a ragged tree (64 + 4 + 2), proofs of every shape. The same changes as
    # the 1,000-change test, and a key doubled, a float, a NaN, deep nesting in an entry
    # line; each verdict (reason, line, leaf) is compared with the verifier's when every
    # entry line is read by strict_json and every proof is checked alone, as before.
    fill(sqlite_log, 70)
    lines = export_lines(sqlite_log, **({"app_id": "app-1"} if filtered else {}))
    key = sqlite_log.public_key
    assert _verdict(lines, key) == ("verified", None, None)
    trials = list(_trials(lines, 200, seed=1207 + filtered))
    for k, (old, new) in enumerate(
        [
            (b'"kind":"entry"', b'"kind":"entry","kind":"entry"'),
            (b'"kind":"entry"', b'"kind":"trailer","kind":"entry"'),
            (b'"action":', b'"action":"x","action":'),
            (b'{"items":', b'{"items":1.0,"items":'),
            (b'"leaf_index":', b'"leaf_index":1.0,"leaf_index":'),
            (b'"counts":', b'"counts":NaN,"counts":'),
            (b'"counts":', b'"counts":' + b"[" * 40 + b"]" * 40 + b',"counts":'),
            (b'"entry":{', b'"entry":{"categories":["a"],'),
        ]
    ):
        changed = list(lines)
        at = 1 + (7 * k) % (len(lines) - 2)
        changed[at] = changed[at].replace(old, new, 1)
        assert changed[at] != lines[at]
        trials.append(changed)
    verdicts = [_verdict(mutated, key) for mutated in trials]
    with monkeypatch.context() as patched:
        patched.setattr(IncreasingInclusions, "check", _full_check)
        patched.setattr(verify, "_assembled_entry", _strict_entry)
        assert _verdict(lines, key) == ("verified", None, None)
        reference = [_verdict(mutated, key) for mutated in trials]
    assert verdicts == reference
    assert all(verdict[1] is not None for verdict in verdicts)
    assert any("inclusion proof" in verdict[0] for verdict in verdicts)


def _entry(line: bytes) -> dict[str, Any]:
    return json.loads(line)  # type: ignore[no-any-return]


def _refused(lines: list[bytes], key: object) -> VerificationError:
    with pytest.raises(VerificationError) as caught:
        verify_export(lines, key, ORIGIN)  # type: ignore[arg-type]
    return caught.value


def _line(obj: dict[str, Any]) -> bytes:
    return rfc8785.dumps(obj) + b"\n"


def test_each_kind_of_change_a_reviewer_asks_about_is_refused_naming_the_line(
    sqlite_log: AuditLog,
) -> None:
    fill(sqlite_log, 37)
    lines = export_lines(sqlite_log)
    key = sqlite_log.public_key

    # Two lines swapped: the first of them names the leaf that is missing there.
    swapped = list(lines)
    swapped[10], swapped[11] = swapped[11], swapped[10]
    error = _refused(swapped, key)
    assert (error.line_number, error.leaf_index) == (11, 10)
    assert "index 9 is missing" in error.reason

    # A line duplicated: the copy is named.
    doubled = [*lines[:21], lines[20], *lines[21:]]
    error = _refused(doubled, key)
    assert (error.line_number, error.leaf_index) == (22, 19)
    assert "reordered or duplicated" in error.reason

    # The tail cut off: after the last entry, or in the middle of a line of a file.
    error = _refused(lines[:-1], key)
    assert error.line_number == len(lines) - 1 and "truncated" in error.reason
    error = _refused(lines[:30], key)
    assert error.line_number == 30 and "truncated" in error.reason
    cut = b"".join(lines)[: -len(lines[-1]) - 40]
    error = _refused(cut, key)  # type: ignore[arg-type]
    assert error.line_number == len(lines) - 1 and "no newline" in error.reason

    # The trailer's signature or the header's key ids changed.
    trailer = _entry(lines[-1])
    signature = bytearray(base64.b64decode(trailer["signature"]))
    signature[5] ^= 1
    error = _refused(
        [*lines[:-1], _line({**trailer, "signature": base64.b64encode(signature).decode()})], key
    )
    assert error.line_number == len(lines) and "signature over the export" in error.reason
    header = _entry(lines[0])
    for name in ("key_id", "note_key_id"):
        changed = "0" * 64 if name == "key_id" else "00000000"
        error = _refused([_line({**header, name: changed}), *lines[1:]], key)
        assert error.line_number == 1 and name in error.reason


def test_a_line_of_another_export_of_the_same_log_is_refused_at_that_line(
    sqlite_log: AuditLog,
) -> None:
    # The same entry at the same leaf, from an export of the log grown since: its proof
    # is of another tree, so it is refused where it stands, not at the trailer; whether
    # its hashes differ from the line before's (the path shared) or below it.
    fill(sqlite_log, 37)
    older = export_lines(sqlite_log)
    fill(sqlite_log, 30)
    newer = export_lines(sqlite_log)
    key = sqlite_log.public_key
    for leaf in (0, 1, 17, 32, 36):
        assert _entry(older[leaf + 1])["entry"] == _entry(newer[leaf + 1])["entry"]
        assert older[leaf + 1] != newer[leaf + 1]
        error = _refused([*older[: leaf + 1], newer[leaf + 1], *older[leaf + 2 :]], key)
        assert (error.line_number, error.leaf_index) == (leaf + 2, leaf)
        assert "inclusion proof" in error.reason and "altered" in error.reason


def test_a_csv_and_a_jsonl_trail_verify_alike(sqlite_log: AuditLog, tmp_path: Path) -> None:
    fill(sqlite_log, 45)
    table, buffer = tmp_path / "trail.csv", io.StringIO()
    export_csv(sqlite_log, table)
    export_jsonl(sqlite_log, buffer)
    key = sqlite_log.public_key
    by_csv = verify_export(table, key, ORIGIN)
    by_jsonl = verify_export(buffer.getvalue().encode(), key, ORIGIN)
    assert (
        (by_csv.entry_count, by_csv.root)
        == (by_jsonl.entry_count, by_jsonl.root)
        == (
            45,
            by_jsonl.root,
        )
    )
