"""A long upgrade of a previous-schema store under load, both backends (decisions
0149-upgrade-and-backup-processes and 0161-start-locks).

The store of ``test_upgrade_processes.previous_schema_store`` (bob's data, the views branch
at ``0007`` and the keys branch at ``0005``). Five real processes of this release are
started on it at the same moment: three plain starts and two writers, which, once up,
grant a consent and capture five interactions each. Whichever process runs the upgrade
is slowed down (a test hook in every child: a pause of ``STRETCH_S`` right after the
upgrade's first statement, inside its transaction), so the others meet it midway.

What must hold: exactly one process runs the upgrade; all five come up; none comes up
(and so none writes, or serves) before the upgrade's pause is over, i.e. nobody works on
a half-upgraded store; every write is kept; the store ends at head with bob whole.
Starts queue on the schema lock (an flock on SQLite, an advisory lock on PostgreSQL) for
as long as the upgrade runs, up to ``UPROF_SCHEMA_LOCK_WAIT_S`` (300 s by default, far
above the pause; test_schema_lock_wait.py tests the bound).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.test_upgrade_processes import (
    assert_upgraded_and_intact,
    previous_schema_store,
)

#: How long the upgrading process pauses inside the upgrade.
STRETCH_S = 4.0
#: Captures each writer makes once it is up.
WRITES = 5
ROLES = ["start", "start", "start", "write:carol", "write:dave"]

_LOADED_START = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import sqlalchemy as sa
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel, consent, say
    from uprof.settings import Settings

    data_dir, url, role, stretch, out, writes = sys.argv[1:7]
    out = Path(out)

    @sa.event.listens_for(sa.Engine, "after_cursor_execute")
    def _stretch(conn, cursor, statement, *rest):
        # The upgrade's first statement: whoever runs it pauses inside the transaction.
        if "CREATE TABLE rate_limit_slots" in " ".join(statement.split()):
            (out / f"upgrading-{os.getpid()}").write_text(repr(time.time()))
            time.sleep(float(stretch))

    while not (out / "go").exists():  # all at the same moment
        time.sleep(0.005)
    settings = Settings(data_dir=Path(data_dir), database_url=url or None, embedder="hashing")
    kernel = build_kernel(settings, FakeClock())
    up = time.time()
    captures = 0
    try:
        if role.startswith("write:"):
            subject = role.split(":", 1)[1]
            consent(kernel, subject)
            for i in range(int(writes)):
                kernel.capture(subject, say(f"{subject} wrote note {i}", ref=f"{subject}-{i}"))
            captures = len(kernel.export_subject(subject)["captured_events"])
    finally:
        kernel.close()
    (out / f"up-{os.getpid()}").write_text(json.dumps({"role": role, "up": up, "n": captures}))
    print("ok", flush=True)
    """
)


def test_a_long_upgrade_under_load_is_run_once_and_waited_for(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = previous_schema_store(backend, clock)
    url = backend.url if backend.kind == "postgres" else ""
    out = tmp_path / "out"
    out.mkdir()
    processes = [
        children.PythonChild(
            _LOADED_START,
            str(settings.data_dir),
            url,
            role,
            str(STRETCH_S),
            str(out),
            str(WRITES),
        )
        for role in ROLES
    ]
    (out / "go").touch()
    outcomes = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        outcomes.append((process.returncode, stdout.strip(), stderr[-3000:]))
    assert all(code == 0 and text == "ok" for code, text, _ in outcomes), outcomes

    upgrades = sorted(out.glob("upgrading-*"))
    assert len(upgrades) == 1, [p.name for p in upgrades]  # one process upgraded
    paused_until = float(upgrades[0].read_text()) + STRETCH_S
    ups = [json.loads(p.read_text()) for p in out.glob("up-*")]
    assert sorted(u["role"] for u in ups) == sorted(ROLES)
    early = [u for u in ups if u["up"] < paused_until]
    assert not early, (early, paused_until)  # nobody up inside the upgrade
    assert {u["role"]: u["n"] for u in ups if u["role"] != "start"} == {
        "write:carol": WRITES,
        "write:dave": WRITES,
    }
    assert_upgraded_and_intact(settings, clock)
