"""Files handed in whole are read within a bound (bug NG, decision 0171's Left).

The CLI read a receipt, a proof document, a key history, a trusted checkpoint, a public
key and a rotation proof whole (``read_bytes()``): a 2 GB file, ``/dev/zero`` or a FIFO
fed without end given as one of them took hours or all the memory. Each is now read
through one helper, at most ``MAX_DOCUMENT_BYTES`` (16 MiB): a longer file is refused,
exit 2, naming the option and the limit (a regular file by its size, before reading it).

The upload check (the console, ``POST /v1/audit/verify``) quoted a failing line by
splitting the whole upload into a list of lines: 160 MiB of pointers for a 20 MiB upload
of empty lines, to quote line 1. It now finds the one line it quotes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from audit.check import QUOTED_CHARS, check_upload
from audit.keys import public_key_pem
from uprof.cli.main import app as cli

#: The documented limit (docs/cli.md).
LIMIT = 16 * 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def _said(result: Any) -> str:
    return " ".join(result.output.replace("│", " ").split())


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    pem = tmp_path / "audit.pem"
    pem.write_bytes(public_key_pem(Ed25519PrivateKey.generate().public_key()))
    small = tmp_path / "small.note"
    small.write_text("o\n1\nAAAA\n\n")
    big = tmp_path / "big"
    with big.open("wb") as f:  # sparse: costs no disk, reads as LIMIT + 1 zero bytes
        f.truncate(LIMIT + 1)
    return {"pem": pem, "small": small, "big": big}


#: (command line, the option named), with {big}, {pem}, {small} filled in.
CASES = [
    (["verify", "{small}", "--public-key", "{big}"], "--public-key"),
    (["verify", "{small}", "--public-key", "{pem}", "--trusted-checkpoint", "{big}"],
     "--trusted-checkpoint"),
    (["verify", "{small}", "--public-key", "{pem}", "--key-history", "{big}"], "--key-history"),
    (["verify", "{small}", "--public-key", "{pem}", "--rotation-proof", "{big}"],
     "--rotation-proof"),
    (["verify-proof", "{big}", "--public-key", "{pem}", "--trusted-checkpoint", "{small}"],
     "PATH"),
    (["verify-proof", "{small}", "--public-key", "{pem}", "--trusted-checkpoint", "{big}"],
     "--trusted-checkpoint"),
    (["verify-receipt", "{big}", "--public-key", "{pem}"], "PATH"),
    (["prove", "--out", "{small}.out", "--from", "{big}"], "--from"),
]  # fmt: skip


def _args(line: list[str], files: dict[str, Path]) -> list[str]:
    return [arg.format(**{k: str(v) for k, v in files.items()}) for arg in line]


@pytest.mark.parametrize(
    ("line", "option"), CASES, ids=[" ".join([*c[0][:1], c[1]]) for c in CASES]
)
def test_a_file_over_the_limit_is_refused_naming_the_option(
    line: list[str], option: str, files: dict[str, Path]
) -> None:
    """NG: one byte over 16 MiB is refused, exit 2, naming the option and the limit (on
    main: read whole, then refused as not a key, note or receipt, exit 1)."""
    result = CliRunner().invoke(cli, ["audit", *_args(line, files)])
    said = _said(result)
    assert result.exit_code == 2, said
    assert option in said and str(LIMIT) in said, said


def test_a_file_at_the_limit_is_read(files: dict[str, Path]) -> None:
    """The limit's edge: a file of exactly 16 MiB is read (and then refused as what it
    is, not as too long)."""
    os.truncate(files["big"], LIMIT)
    line = ["verify-receipt", "{big}", "--public-key", "{pem}"]
    result = CliRunner().invoke(cli, ["audit", *_args(line, files)])
    assert result.exit_code == 1 and str(LIMIT) not in _said(result), _said(result)


def _cli_within(memory: int, args: list[str]) -> subprocess.CompletedProcess[str]:
    """The CLI in a process whose address space is capped: reading without a bound
    ends in ``MemoryError`` there instead of taking the machine's memory."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
        from uprof.cli.main import app
        sys.argv = ["uprof", *{args!r}]
        app()
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )


def test_dev_zero_is_refused_after_the_limit(files: dict[str, Path]) -> None:
    """NG: ``/dev/zero`` as a trusted checkpoint is read to one byte past the limit and
    refused, exit 2 (on main: read until the memory ran out)."""
    done = _cli_within(
        1 << 31,
        [
            "audit", "verify", str(files["small"]), "--public-key", str(files["pem"]),
            "--trusted-checkpoint", "/dev/zero",
        ],
    )  # fmt: skip
    said = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2, said[-2000:]
    assert "--trusted-checkpoint" in said and str(LIMIT) in said, said[-2000:]


def test_a_fifo_fed_without_end_is_refused_after_the_limit(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """NG: a FIFO (``<(...)``) a writer feeds without end, as a receipt, is refused once
    one byte past the limit has arrived; the writer then ends on its broken pipe."""
    fifo = tmp_path / "receipt.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"cat /dev/zero > '{fifo}'"])
    try:
        done = _cli_within(
            1 << 31, ["audit", "verify-receipt", str(fifo), "--public-key", str(files["pem"])]
        )
    finally:
        writer.kill()
        writer.wait()
    said = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2, said[-2000:]
    assert "PATH" in said and str(LIMIT) in said, said[-2000:]


# --- The upload check quotes one line ---------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "number"),
    [
        (b"\n" * (20 * 1024 * 1024), 1),  # 20 MiB of empty lines, refused at line 1
        (b"x\n" * (10 * 1024 * 1024), 1),
    ],
    ids=["empty-lines", "short-lines"],
)
def test_the_upload_check_quotes_a_line_without_splitting_the_upload(
    raw: bytes, number: int
) -> None:
    """NG: quoting the failing line costs about the line, not a list of every line of a
    20 MiB upload (on main: a peak of 172 MiB for the empty lines, 85 MiB for the short)."""
    key = Ed25519PrivateKey.generate().public_key()
    tracemalloc.start()
    try:
        checked = check_upload(raw, "export", key, "o")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not checked.ok and checked.line_number == number
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes for a {len(raw)}-byte upload"


def test_the_quote_is_the_failing_line_cut_at_the_quoted_length() -> None:
    """The quote is still the failing line, cut at ``QUOTED_CHARS`` characters, even when
    a character of four bytes straddles the cut."""
    key = Ed25519PrivateKey.generate().public_key()
    line = "{" + "\U0001f600" * (QUOTED_CHARS + 5)
    checked = check_upload((line + "\n").encode(), "export", key, "o")
    assert not checked.ok and checked.line_number == 1
    assert checked.line_text == line[:QUOTED_CHARS]
