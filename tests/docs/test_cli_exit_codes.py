"""docs/cli.md's exit-code table is the CLI's ``EXIT_CODES`` (review of 0198-0200, bug PZ).

Until then docs/cli.md listed exit codes 2 to 6 in a sentence; 1 and 0199's new 7
(stored data damaged) were not in it, and nothing compared the two. The table is read
from the document (rows ``| exit | meaning | errors |`` with the error classes in
backticks) and must name exactly the classes ``EXIT_CODES`` maps to each code, in the
order they are matched (a subclass listed before its base class).
"""

from __future__ import annotations

import ast
import os
import re
import socket
from pathlib import Path

import pytest

from tests import children
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


UPROF = Path(__file__).resolve().parents[2] / "uprof"
#: The exits a command makes itself with a code the table gives another meaning (not 1,
#: any other error, nor 2, bad input): (file under uprof/, function, code) and the words
#: the table's row for that code must hold (review of 0199 and 0201, bug QE).
OWN_EXITS = {
    ("cli/serve.py", "serve", 3): "`uprof serve` whose server could not start",
    ("mcp/cli.py", "run", 3): "`uprof mcp` (stdio) whose `UPROF_API_KEY`",
    ("cli/serve.py", "apps_revoke", 5): "`apps revoke` of a key id",
}
#: Where the code comes from the table itself (or a signal), not a literal.
TABLE_EXITS = {("cli/context.py", "fail")}


class _Exits(ast.NodeVisitor):
    """Every ``typer.Exit``/``SystemExit``/``sys.exit``/``ctx.exit`` call of a module:
    (function, code or None when the code is not a literal)."""

    def __init__(self) -> None:
        self.functions: list[str] = ["<module>"]
        self.found: list[tuple[str, int | None]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        if name in ("Exit", "SystemExit", "exit"):
            code = node.args[0] if node.args else ast.Constant(0)
            literal = code.value if isinstance(code, ast.Constant) else None
            self.found.append((self.functions[-1], literal))
        self.generic_visit(node)


def _exits() -> list[tuple[str, str, int | None]]:
    found = []
    for path in sorted(UPROF.rglob("*.py")):
        visitor = _Exits()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        where = path.relative_to(UPROF).as_posix()
        found += [(where, function, code) for function, code in visitor.found]
    return found


def test_qe_every_code_a_command_exits_with_itself_is_in_the_table() -> None:
    """Bug QE: ``uprof serve`` exits 3 when its server cannot start (its port taken),
    ``uprof mcp`` 3 when its stdio key is missing or revoked, ``apps revoke`` 5 for a key
    id no live key has: the table said 3 was consent or the policy, 5 a subject. Every
    literal exit code in uprof/ is 1, 2 or one of ``OWN_EXITS``, whose row says it.
    main at f9d71eac: the rows for 3 and 5 named none of them."""
    meanings = {
        int(found.group(1)): line
        for line in CLI_MD.read_text(encoding="utf-8").splitlines()
        if (found := ROW.match(line.strip()))
    }
    exits = _exits()
    own = {(where, function, code) for where, function, code in exits if code not in (None, 1, 2)}
    assert own == set(OWN_EXITS), "a command exits with a code the table means otherwise"
    for (_, _, code), words in OWN_EXITS.items():
        assert words in meanings[code], f"exit {code}'s row does not say {words}"
    computed = {(where, function) for where, function, code in exits if code is None}
    assert computed == TABLE_EXITS, "an exit code computed outside the table"


def test_qe_apps_revoke_of_an_unknown_key_is_an_error_exit_5(tmp_path: Path) -> None:
    """Bug QE, a real CLI process: exit 5 as the table says, and the refusal said as every
    error is (``error: ...`` on stderr). main at f9d71eac: exit 5, said on stdout."""
    env = dict(os.environ, UPROF_DATA_DIR=str(tmp_path / "data"), UPROF_EMBEDDER="hashing")
    # On a deployment: where none is, the command exits 8 (0237-the-wrong-folder).
    assert children.run_python(children.CLI_SCRIPT, "init", env=env).returncode == 0
    done = children.run_python(children.CLI_SCRIPT, "apps", "revoke", "nosuch", env=env)
    assert done.returncode == 5, done.stderr
    assert done.stdout == "", done.stdout
    assert " ".join(done.stderr.split()) == "error: no live key with id nosuch", done.stderr


def _cli_env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, UPROF_DATA_DIR=str(tmp_path / "data"), UPROF_EMBEDDER="hashing")


@pytest.mark.parametrize(
    "args",
    [
        ("serve", "--port", "70000"),
        ("serve", "--port", "-1"),
        ("mcp", "--transport", "http", "--port", "65536"),
    ],
    ids=["serve-70000", "serve-minus-1", "mcp-http-65536"],
)
def test_rx_a_port_outside_0_to_65535_is_bad_input_exit_2(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Bug RX, real CLI processes. main at c4cd4030: ``--port 70000`` served on port 4464
    (the address lookup takes it modulo 65536) while printing 70000, and 65536 on a port
    the system picked (so both ran until this test's wait ran out); ``-1`` exited 3, a
    server that could not start."""
    done = children.run_python(children.CLI_SCRIPT, *args, env=_cli_env(tmp_path), timeout=60)
    assert done.returncode == 2, done.stderr
    assert "'--port'" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "args", [("serve",), ("mcp", "--transport", "http")], ids=["serve", "mcp-http"]
)
def test_rx_a_server_that_cannot_listen_exits_3_as_the_table_says(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Bug RX: ``uprof mcp --transport http`` exits 3 too when it cannot listen (uvicorn's
    own 3, as ``uprof serve``), and for an address not this machine's as for a port taken;
    main at c4cd4030: the same codes, but exit 3's row named ``uprof serve`` and a port
    taken only."""
    row = next(
        line for line in CLI_MD.read_text(encoding="utf-8").splitlines() if line.startswith("| 3 |")
    )
    for words in (
        "`uprof mcp --transport http`",
        "the port taken",
        "an address not this machine's",
    ):
        assert words in row, f"exit 3's row does not say {words}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = children.run_python(
            children.CLI_SCRIPT, *args, "--port", port, env=_cli_env(tmp_path), timeout=120
        )
    assert done.returncode == 3, done.stderr
    assert "address already in use" in done.stderr, done.stderr


def test_ry_an_unknown_consent_id_exits_5_saying_how_to_find_the_consent(tmp_path: Path) -> None:
    """Bug RY, a real CLI process: ``consent withdraw`` of a consent id the subject does not
    hold exits 5 (the table's row now says so) with a hint that lists the consents. main at
    c4cd4030: exit 5, hinting to "check the subject reference" of a subject that exists."""
    env = _cli_env(tmp_path)
    granted = children.run_python(
        children.CLI_SCRIPT,
        *("consent", "grant", "--subject", "alice", "--app", "app:calendar"),
        *("--category", "schedule", "--purpose", "scheduling"),
        env=env,
    )
    assert granted.returncode == 0, granted.stderr
    done = children.run_python(
        children.CLI_SCRIPT,
        *("consent", "withdraw", "--subject", "alice", "--consent", "nosuch"),
        env=env,
    )
    said = " ".join(done.stderr.split())
    assert done.returncode == 5, said
    assert "error: no consent with that id for this subject and app" in said, said
    assert "uprof consent list --subject S" in said and "subject reference" not in said, said
