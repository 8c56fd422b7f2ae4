"""``uprof backup`` killed (``os._exit``, as kill -9) midway, in a real process, both
backends (decision 0149-upgrade-and-backup-processes): no backup folder appears, a
restore from what it left is refused, the stores serve on, and the next backup restores
(and removes what the killed one left, bug KI: tests/kernel/test_backup_partials.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from domain.errors import InvalidInputError
from tests.children import run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import cli_env
from tests.kernel.test_keys_apart import assert_bob_intact, filled_deployment
from uprof.services.backup import restore

#: Where the backup dies: Python run in its process before the command.
POINTS = {
    "while-copying": """
        from uprof.backends import backend_for_settings
        from uprof.settings import Settings
        kind = type(backend_for_settings(Settings()))
        kind.backup = lambda self, settings, out: (
            (out / "views.sqlite").write_bytes(b"half"), os._exit(9))
        """,
    "before-manifest": """
        import uprof.services.backup as b
        b._sign = lambda *a, **k: os._exit(9)
        """,
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_backup_killed_midway_leaves_no_backup_and_the_next_one_restores(
    backend: Backend, clock: FakeClock, tmp_path: Path, point: str
) -> None:
    settings = filled_deployment(backend, clock, "bob")
    env = cli_env(backend)
    script = "import os\n" + textwrap.dedent(POINTS[point])
    script += "from uprof.cli.main import app\napp()\n"
    bk = tmp_path / "out" / "bk"
    died = run_python(script, "backup", "--to", str(bk), env=env, timeout=180)
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]
    assert not bk.exists()
    leftovers = [p for p in (tmp_path / "out").glob(".bk.partial-*") if p.is_dir()]
    assert len(leftovers) <= 1, leftovers
    for left in leftovers:
        with pytest.raises(InvalidInputError):
            restore(settings, left)
    assert_bob_intact(settings, clock, audit_verifies=False)
    made = run_python("from uprof.cli.main import app\napp()\n", "backup", "--to", str(bk), env=env)
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    # The next backup into the same folder removed what the killed one left (bug KI).
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["bk"]
    restore(settings, bk)
    assert_bob_intact(settings, clock, audit_verifies=True)
