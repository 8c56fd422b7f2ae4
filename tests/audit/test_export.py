"""Exports and the offline verifier, including the 1,000-mutation tamper test."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.errors import VerificationError
from audit.export import export_csv, export_jsonl
from audit.keys import public_key_pem
from audit.log import AuditLog
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN, audit_log_on, sample_entry
from tests.audit.test_log import fill


def export_lines(log: AuditLog, **filters: str) -> list[bytes]:
    buffer = io.StringIO()
    export_jsonl(log, buffer, **filters)
    return buffer.getvalue().encode().splitlines(keepends=True)


def test_jsonl_and_csv_exports_verify_on_both_backends(log: AuditLog, tmp_path: Path) -> None:
    tree = fill(log, 37)
    jsonl, csv_path = tmp_path / "trail.jsonl", tmp_path / "trail.csv"
    summary = export_jsonl(log, jsonl)
    assert (summary.tree_size, summary.entry_count) == (37, 37)
    report = verify_export(jsonl, public_key_pem(log.public_key), ORIGIN)
    assert (report.format, report.entry_count, report.tree_size) == ("jsonl", 37, 37)
    assert report.root == tree.root()
    assert not report.filtered
    assert (report.first_leaf_index, report.last_leaf_index) == (0, 36)
    assert report.export_sha256 == summary.export_sha256

    export_csv(log, csv_path)
    report = verify_export(csv_path, log.public_key, ORIGIN)
    assert (report.format, report.entry_count) == ("csv", 37)

    lines = jsonl.read_text().splitlines()
    header, first, trailer = json.loads(lines[0]), json.loads(lines[1]), json.loads(lines[-1])
    assert header["kind"] == "header" and header["checkpoint"] == log.latest_checkpoint().note
    assert header["key_id"] == log.key_id
    assert first["leaf_index"] == 0 and first["entry"]["action"] == "AccessDecision"
    assert trailer == {**trailer, "kind": "trailer", "entry_count": 37}
    assert all(line.encode() == rfc8785.dumps(json.loads(line)) for line in lines)


def test_filtered_exports_verify_and_hold_only_matching_entries(log: AuditLog) -> None:
    fill(log, 50)
    lines = export_lines(log, subject_ref="sub_0003", since="2025-01-01T00:00:05Z")
    report = verify_export(lines, log.public_key, ORIGIN)
    expected = [
        e.leaf_index for e in log.entries(subject_ref="sub_0003", since="2025-01-01T00:00:05Z")
    ]
    assert report.filtered and report.entry_count == len(expected) > 0
    assert report.filter == {"subject_ref": "sub_0003", "since": "2025-01-01T00:00:05.000000Z"}
    indexes = [json.loads(line)["leaf_index"] for line in lines[1:-1]]
    assert indexes == expected


def test_empty_log_and_empty_filter_results_verify(sqlite_log: AuditLog) -> None:
    report = verify_export(export_lines(sqlite_log), sqlite_log.public_key, ORIGIN)
    assert (report.tree_size, report.entry_count) == (0, 0)
    fill(sqlite_log, 5)
    report = verify_export(export_lines(sqlite_log, app_id="nobody"), sqlite_log.public_key, ORIGIN)
    assert (report.tree_size, report.entry_count, report.filtered) == (5, 0, True)


def test_entries_appended_after_the_export_checkpoint_are_not_included(
    sqlite_log: AuditLog,
) -> None:
    fill(sqlite_log, 5)
    lines = export_lines(sqlite_log)
    fill(sqlite_log, 5)
    assert verify_export(lines, sqlite_log.public_key, ORIGIN).tree_size == 5


def test_wrong_key_or_origin_fails(sqlite_log: AuditLog) -> None:
    fill(sqlite_log, 5)
    lines = export_lines(sqlite_log)
    with pytest.raises(VerificationError, match="key_id"):
        verify_export(lines, Ed25519PrivateKey.generate().public_key(), ORIGIN)
    with pytest.raises(VerificationError, match="origin"):
        verify_export(lines, sqlite_log.public_key, "someone.else/log")


def test_a_second_log_cannot_lend_its_entries(
    sqlite_log: AuditLog, signing_key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    from audit.tables import create_tables
    from uprof.backends import backend_for

    fill(sqlite_log, 6)
    other_engine = sa.create_engine(f"sqlite:///{tmp_path / 'other.sqlite'}")
    create_tables(other_engine, backend_for(other_engine))
    try:
        other = audit_log_on(other_engine, signing_key)
        other.append_many(sample_entry(i) for i in range(6))
        other.append({"action": "forged"})
        ours, theirs = export_lines(sqlite_log), export_lines(other)
    finally:
        other_engine.dispose()
    spliced = [ours[0], *theirs[1:-1], ours[-1]]
    with pytest.raises(VerificationError):
        verify_export(spliced, signing_key.public_key(), ORIGIN)


# --- The tamper test ----------------------------------------------------------------------------

Mutation = Callable[[random.Random, list[bytes]], tuple[list[bytes], str]]


def _byte_edit(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    blob = bytearray(b"".join(lines))
    position = rng.randrange(len(blob))
    new = rng.choice([rng.randrange(256), rng.randrange(32, 127)])
    while new == blob[position]:
        new = rng.randrange(256)
    blob[position] = new
    return bytes(blob).split(b"\n")[:-1] if blob.endswith(b"\n") else bytes(blob).split(
        b"\n"
    ), "byte"


def _entry_line(rng: random.Random, lines: list[bytes]) -> int:
    return rng.randrange(1, len(lines) - 1)


def _semantic_edit(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    k = _entry_line(rng, lines)
    obj = json.loads(lines[k])
    entry = obj["entry"]
    choice = rng.randrange(5)
    if choice == 0:
        entry["action"] = entry["action"] + "x"
    elif choice == 1:
        entry["subject_ref"] = "sub_9999"
    elif choice == 2:
        entry["counts"] = {"items": entry["counts"]["items"] + 1}
    elif choice == 3:
        entry.pop("decision")
    else:
        entry["reason_code"] = "added"
    out = list(lines)
    out[k] = rfc8785.dumps(obj) + b"\n"
    return out, "semantic"


def _proof_edit(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    k, j = _entry_line(rng, lines), _entry_line(rng, lines)
    obj, donor = json.loads(lines[k]), json.loads(lines[j])
    choice = rng.randrange(3)
    if choice == 0 or len(obj["inclusion"]) < 2:
        obj["inclusion"].append(donor["inclusion"][0])
    elif choice == 1:
        obj["inclusion"].pop(rng.randrange(len(obj["inclusion"])))
    else:
        position = rng.randrange(len(obj["inclusion"]))
        replacement = donor["inclusion"][position % len(donor["inclusion"])]
        if replacement == obj["inclusion"][position]:
            replacement = "A" * 43 + "="
        obj["inclusion"][position] = replacement
    out = list(lines)
    out[k] = rfc8785.dumps(obj) + b"\n"
    return out, "proof"


def _index_edit(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    k = _entry_line(rng, lines)
    obj = json.loads(lines[k])
    obj["leaf_index"] = rng.choice(
        [obj["leaf_index"] + rng.choice([-1, 1, 7]), rng.randrange(2000)]
    )
    if obj["leaf_index"] == json.loads(lines[k])["leaf_index"]:
        obj["leaf_index"] += 1
    out = list(lines)
    out[k] = rfc8785.dumps(obj) + b"\n"
    return out, "index"


def _deletion(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    out = list(lines)
    count = rng.choice([1, 1, 1, 2, 10])
    start = rng.randrange(len(out) - count + 1)
    del out[start : start + count]
    return out, "deletion"


def _reordering(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    out = list(lines)
    i, j = rng.sample(range(len(out)), 2)
    if rng.random() < 0.5:
        out[i], out[j] = out[j], out[i]
    else:
        out.insert(j, out.pop(i))
    return out, "reordering"


def _insertion(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    out = list(lines)
    choice = rng.randrange(3)
    if choice == 0:
        line = out[_entry_line(rng, out)]  # a duplicate of a genuine entry
    elif choice == 1:
        obj = json.loads(out[_entry_line(rng, out)])
        obj["entry"] = {"action": "forged", "recorded_at": "2025-01-01T00:00:00.000000Z"}
        line = rfc8785.dumps(obj) + b"\n"
    else:
        line = out[rng.choice([0, len(out) - 1])]  # a second header or trailer
    out.insert(rng.randrange(len(out) + 1), line)
    return out, "insertion"


def _header_trailer_edit(rng: random.Random, lines: list[bytes]) -> tuple[list[bytes], str]:
    out = list(lines)
    header, trailer = json.loads(out[0]), json.loads(out[-1])
    choice = rng.randrange(4)
    if choice == 0:
        flip = not header["filtered"]
        header["filtered"], header["filter"] = flip, {"app_id": "app-1"} if flip else {}
    elif choice == 1:
        header["tree_size"] += 1
    elif choice == 2:
        trailer["entry_count"] -= 1
    else:
        trailer["export_sha256"] = "0" * 64
    out[0], out[-1] = rfc8785.dumps(header) + b"\n", rfc8785.dumps(trailer) + b"\n"
    return out, "header/trailer"


MUTATIONS: list[Mutation] = [
    _byte_edit,
    _byte_edit,
    _semantic_edit,
    _proof_edit,
    _index_edit,
    _deletion,
    _reordering,
    _insertion,
    _header_trailer_edit,
]


def run_tamper_trials(
    lines: list[bytes], public_key: object, trials: int, seed: int
) -> dict[str, int]:
    rng = random.Random(seed)
    detected: dict[str, int] = {}
    for _ in range(trials):
        mutated, kind = rng.choice(MUTATIONS)(rng, lines)
        mutated = [line if line.endswith(b"\n") else line + b"\n" for line in mutated]
        assert mutated != lines
        with pytest.raises(VerificationError) as caught:
            verify_export(mutated, public_key, ORIGIN)  # type: ignore[arg-type]
        assert caught.value.line_number is not None
        detected[kind] = detected.get(kind, 0) + 1
    return detected


def test_an_untouched_1000_entry_trail_verifies(sqlite_log: AuditLog) -> None:
    fill(sqlite_log, 1000, batch=100)
    lines = export_lines(sqlite_log)
    report = verify_export(lines, sqlite_log.public_key, ORIGIN)
    assert (report.entry_count, report.tree_size, report.filtered) == (1000, 1000, False)


def test_every_one_of_1000_random_tamperings_of_a_300_entry_trail_is_detected(
    sqlite_log: AuditLog,
) -> None:
    # 300 entries: a tree of depth 9 that is not a power of two, so proofs of the right
    # edge have the short paths a full tree has not. The verifier stops at the first bad
    # line, so a trial costs its position: on 1,000 entries the 1,000 trials took ~40 s of
    # one core, on 300 about a third (decision 0065); the kinds and count are unchanged.
    fill(sqlite_log, 300, batch=100)
    lines = export_lines(sqlite_log)
    assert len(lines) == 302
    verify_export(lines, sqlite_log.public_key, ORIGIN)
    detected = run_tamper_trials(lines, sqlite_log.public_key, trials=1000, seed=20250101)
    assert sum(detected.values()) == 1000
    assert set(detected) == {
        "byte",
        "semantic",
        "proof",
        "index",
        "deletion",
        "reordering",
        "insertion",
        "header/trailer",
    }


def test_tampering_with_a_filtered_export_is_detected(sqlite_log: AuditLog) -> None:
    fill(sqlite_log, 400, batch=100)
    lines = export_lines(sqlite_log, app_id="app-1")
    assert len(lines) > 100
    verify_export(lines, sqlite_log.public_key, ORIGIN)
    detected = run_tamper_trials(lines, sqlite_log.public_key, trials=300, seed=7)
    assert sum(detected.values()) == 300


def test_a_dropped_entry_of_a_filtered_export_is_named_by_the_signature(
    sqlite_log: AuditLog,
) -> None:
    fill(sqlite_log, 40)
    lines = export_lines(sqlite_log, subject_ref="sub_0001")
    del lines[3]
    trailer = json.loads(lines[-1])
    trailer["entry_count"] -= 1
    lines[-1] = rfc8785.dumps(trailer) + b"\n"
    with pytest.raises(VerificationError, match="export_sha256") as caught:
        verify_export(lines, sqlite_log.public_key, ORIGIN)
    assert caught.value.line_number == len(lines)


def test_the_first_failing_entry_is_named(sqlite_log: AuditLog) -> None:
    fill(sqlite_log, 30)
    lines = export_lines(sqlite_log)
    obj = json.loads(lines[12])
    obj["entry"]["decision"] = "allow" if obj["entry"]["decision"] == "deny" else "deny"
    lines[12] = rfc8785.dumps(obj) + b"\n"
    with pytest.raises(VerificationError) as caught:
        verify_export(lines, sqlite_log.public_key, ORIGIN)
    assert (caught.value.line_number, caught.value.leaf_index) == (13, 11)
    assert "line 13" in str(caught.value) and "leaf_index 11" in str(caught.value)

    lines = export_lines(sqlite_log)
    del lines[5]  # leaf 4 is gone
    with pytest.raises(VerificationError, match="index 4 is missing") as caught:
        verify_export(lines, sqlite_log.public_key, ORIGIN)
    assert (caught.value.line_number, caught.value.leaf_index) == (6, 5)


def test_tampering_with_a_csv_export_is_detected(sqlite_log: AuditLog, tmp_path: Path) -> None:
    fill(sqlite_log, 200, batch=100)
    path = tmp_path / "trail.csv"
    export_csv(sqlite_log, path)
    original = path.read_bytes()
    verify_export(path, sqlite_log.public_key, ORIGIN)
    rng = random.Random(99)
    rows = original.splitlines(keepends=True)
    for trial in range(300):
        if trial % 3 == 0:
            blob = bytearray(original)
            position = rng.randrange(len(blob))
            blob[position] = (blob[position] + rng.randrange(1, 256)) % 256
            mutated = bytes(blob)
        elif trial % 3 == 1:
            copy = list(rows)
            del copy[rng.randrange(len(copy))]
            mutated = b"".join(copy)
        else:
            copy = list(rows)
            i, j = rng.sample(range(len(copy)), 2)
            copy[i], copy[j] = copy[j], copy[i]
            mutated = b"".join(copy)
        path.write_bytes(mutated)
        with pytest.raises(VerificationError):
            verify_export(path, sqlite_log.public_key, ORIGIN)


def test_csv_copied_columns_must_match_the_entry(sqlite_log: AuditLog, tmp_path: Path) -> None:
    fill(sqlite_log, 5)
    path = tmp_path / "trail.csv"
    export_csv(sqlite_log, path)
    text = path.read_text()
    assert ",sub_0002," in text
    path.write_text(text.replace(",sub_0002,", ",sub_0003,", 1))
    with pytest.raises(VerificationError, match="subject_ref"):
        verify_export(path, sqlite_log.public_key, ORIGIN)
