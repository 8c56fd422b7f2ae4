"""README.md and docs/*.md run as tests (STYLE P14), parsed with sybil.

Each document runs top to bottom in a fresh temporary folder, like a reader following
it: ``python`` blocks share one namespace, ``sh``/``bash`` blocks run in bash (``.venv``
points at this venv, so ``.venv/bin/uprof`` works as written), and ``json`` blocks must
parse. The settings are temporary: every store lives in that folder, and the embedder is
the hashing one (``UPROF_EMBEDDER=hashing``: loading MiniLM in every CLI process would
cost minutes, and no example depends on the model). A block that cannot run here (a
server that runs until stopped, a call to a server, a benchmark of hours) carries a
marker in the document itself, ``<!-- skip: next "why" -->``, with its reason; a block
without one must run and succeed. A document in ``served.SERVED_DOCUMENTS`` gets its own
loopback ``uprof serve`` and keys first, so its SDK examples run against a real server.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import SkipTest

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

from tests.docs.served import SERVED_DOCUMENTS, serving_the_document

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV = Path(sys.executable).parent.parent
SKIP_MARKER = re.compile(r"<!--\s*skip:\s*(\w+)(.*?)-->")


def _environment(workdir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "UPROF_EMBEDDER": "hashing",
        "HOME": str(workdir),
    }


def _run_shell(example: Example) -> None:
    workdir: Path = example.namespace["workdir"]
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", example.parsed],
        cwd=workdir,
        env=_environment(workdir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{example.path}:{example.line}: exit {done.returncode}\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )


def _check_json(example: Example) -> None:
    import json

    json.loads(example.parsed)


SYBIL = Sybil(
    parsers=[
        SkipParser(),
        PythonCodeBlockParser(),
        CodeBlockParser("sh", _run_shell),
        CodeBlockParser("bash", _run_shell),
        CodeBlockParser("json", _check_json),
    ],
)


def _close_kernels(namespace: dict[str, Any]) -> None:
    from uprof.kernel import Uprof

    for value in list(namespace.values()):
        if isinstance(value, Uprof):
            value.close()


def test_every_skip_marker_gives_its_reason() -> None:
    bare = []
    for path in DOCUMENTS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for _action, reason in SKIP_MARKER.findall(line):
                if not re.fullmatch(r'\s*"[^"]{10,}"\s*', reason):
                    bare.append(f"{path.relative_to(ROOT)}:{number}")
    assert bare == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(ROOT)) for p in DOCUMENTS])
def test_the_examples_of_a_document_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".venv").symlink_to(VENV)
    monkeypatch.chdir(tmp_path)
    for name, value in _environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    document = SYBIL.parse(path)
    document.namespace["workdir"] = tmp_path
    ran = skipped = 0
    with contextlib.ExitStack() as stack:
        if str(path.relative_to(ROOT)) in SERVED_DOCUMENTS:
            served = serving_the_document(tmp_path, _environment(tmp_path))
            document.namespace.update(stack.enter_context(served))
        try:
            for example in document:
                try:
                    example.evaluate()
                except SkipTest:
                    skipped += 1
                else:
                    ran += 1
        finally:
            _close_kernels(document.namespace)
    if ran == 0 and skipped == 0:
        pytest.skip("no executable examples in this document (prose, tables, output)")
    assert ran + skipped > 0
