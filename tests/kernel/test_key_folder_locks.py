"""The key folder's and a backup's own lock files against hostile files (decision 0195's
"Left"): every lock file uprof flocks is opened by one checked opener
(``audit.lockfile.open_lock_file``).

- Bug PP: the key folder's lock files (``keks.lock``, ``audit-keys.lock``,
  ``audit-checkpoint.lock``, ``erasures-settle-host.lock``, an erasure's in-flight mark
  and its folder) were opened with ``O_CREAT`` and, but for the settle-host lock,
  without ``O_NOFOLLOW``: a symbolic link made uprof create the file it names anywhere,
  an erasure's mark wrote its host line into the linked file, a hard link, a FIFO,
  another user's file or one others may write were used as locks (that user could hold
  every key rotation or erasure), a folder failed with a traceback; another user's mark
  was taken for a dead process's and removed (its request abandoned).
- Bug PQ: a folder (or a file this user may not open) under a partial backup's writer
  lock name in the backups folder failed every ``uprof backup`` into that folder, and
  the residue audit of it, with a traceback.

Real processes where a lock must still hold across them, and for the commands an
operator runs.
"""

from __future__ import annotations

import fcntl
import os
import socket
import textwrap
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from audit.errors import AuditKeyError
from audit.keyring import FileKeyRing
from tests import children
from tests.conftest import Backend
from tests.kernel.conftest import cli_env, settings_for
from tests.kernel.test_lock_turns_review import (
    _AS_ANY_USER,
    HOSTILE,
    PRECIOUS,
    SAID,
    _plant,
    sqlite_store,  # noqa: F401 (a fixture)
)
from tests.kernel.test_schema_lock_wait import HARNESS_WAIT_S, _flat
from uprof.backends import LockFileRefusedError
from uprof.crypto.keydir import FileKeyMaterialStore
from uprof.ports import ErasureRecord
from uprof.services.backup import partials, remove_stale_partials

REQUEST = "0f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b"

#: Each lock file of the key folder, by its path in the folder, and how uprof takes it.
LOCKS: dict[str, Callable[[Path], AbstractContextManager[object]]] = {
    "keks.lock": lambda folder: FileKeyMaterialStore(folder).ring_lock(exclusive=True),
    "erasures-settle-host.lock": lambda folder: FileKeyMaterialStore(folder).settle_host_turn(),
    f"erasures-in-flight/{REQUEST}.lock": lambda folder: FileKeyMaterialStore(
        folder
    ).erasure_in_flight(REQUEST),
    "audit-keys.lock": lambda folder: FileKeyRing(folder)._lock(),
    "audit-checkpoint.lock": lambda folder: FileKeyRing(folder)._anchor_lock(),
}


#: Every taker of a key-folder lock file: (the file, how uprof takes it). An erasure's mark
#: is taken twice: by the erasure (``erasure_in_flight``) and by a process finishing a
#: request begun elsewhere (0198's ``erasure_finishing``, landed beside 0200 and opened
#: by its own ``os.open``: bug QA, review of 0198-0200).
TAKERS: dict[str, tuple[str, Callable[[Path], AbstractContextManager[object]]]] = {
    **{name: (name, take) for name, take in LOCKS.items()},
    "finishing": (
        f"erasures-in-flight/{REQUEST}.lock",
        lambda folder: FileKeyMaterialStore(folder).erasure_finishing(REQUEST),
    ),
}


@pytest.fixture
def key_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    (folder / "erasures-in-flight").mkdir(mode=0o700)
    return folder


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("taker", sorted(TAKERS))
def test_pp_a_hostile_key_folder_lock_file_is_refused_and_nothing_elsewhere_is_touched(
    key_folder: Path, tmp_path: Path, taker: str, kind: str
) -> None:
    """Bug PP. main at 2ccadb9a: the link's target created (or, for the in-flight mark,
    written), every other kind taken as the lock (a folder: ``IsADirectoryError``; the
    settle-host lock's link: ``OSError`` ELOOP). Bug QA (``finishing``), main at
    8c1c0862: a hard link's file emptied and written, a FIFO ``OSError`` EINVAL, a
    folder ``IsADirectoryError``, another user's or a 0666 file taken as the mark."""
    lock_file, take = TAKERS[taker]
    path = key_folder / lock_file
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = _plant(kind, path, elsewhere)
    raised: Exception | None = None
    try:
        with take(key_folder):
            pass
    except Exception as error:
        raised = error
    if kind == "symlink-to-nothing":
        assert not victim.exists(), "a lock file was created where the link points"
    elif kind in ("symlink-to-a-file", "hard-link"):
        assert victim.read_text() == PRECIOUS, "the file the lock file names was changed"
    assert isinstance(raised, LockFileRefusedError), repr(raised)
    assert str(raised).startswith(f"refused the lock file {path}: it is {SAID[kind]}")
    assert "nothing was changed" in raised.diagnostics()
    assert path.exists() or path.is_symlink(), "the refused file was removed"


def test_pp_an_in_flight_folder_that_is_a_link_is_refused(key_folder: Path, tmp_path: Path) -> None:
    """Bug PP. main at 2ccadb9a: the erasure's mark created, written and deleted in
    whatever folder the link named."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (key_folder / "erasures-in-flight").rmdir()
    (key_folder / "erasures-in-flight").symlink_to(elsewhere)
    with pytest.raises(LockFileRefusedError, match=r"refused the lock folder .* symbolic link"):
        with FileKeyMaterialStore(key_folder).erasure_in_flight(REQUEST):
            pass
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("kind", ["another-users-file", "hard-link"])
def test_pp_a_mark_uprof_did_not_make_is_never_judged_a_dead_processs(
    key_folder: Path, tmp_path: Path, kind: str
) -> None:
    """Bug PP. main at 2ccadb9a: another user's mark (or a hard link) naming this host,
    whose lock nobody held, was judged a dead process's: the start abandons its request
    and the mark was removed. Now it is left alone, as a link or a folder was (IA)."""
    path = key_folder / "erasures-in-flight" / f"{REQUEST}.lock"
    host_line = f"host={socket.gethostname()}\n"
    if kind == "hard-link":
        victim = tmp_path / "victim"
        victim.write_text(host_line)
        os.link(victim, path)
    else:
        path.write_text(host_line)
        path.chmod(0o600)
        os.chown(path, 4242, 4242)
    store = FileKeyMaterialStore(key_folder)
    with store.erasure_owner_gone(REQUEST) as gone:
        assert gone is False
    assert path.read_text() == host_line
    with store.erasure_mark_of_host(REQUEST, "another-host", keep=True) as seen:
        assert seen == "none"


#: Hold ``argv[2]`` (a name in ``LOCKS``) of the key folder ``argv[1]`` until stdin ends.
_HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.kernel.test_key_folder_locks import LOCKS

    with LOCKS[sys.argv[2]](Path(sys.argv[1])):
        print("held", flush=True)
        Path(sys.argv[3]).read_text()  # a FIFO: returns when the test writes it
    """
)


@pytest.mark.parametrize("lock_file", sorted(LOCKS))
def test_held_each_lock_still_excludes_another_process(key_folder: Path, lock_file: str) -> None:
    """Held, and what the fix must keep: a lock file uprof made is taken as before, and
    while one process holds it another cannot take it (tried without waiting)."""
    go = key_folder.parent / "go"
    os.mkfifo(go)
    with children.streaming_child(_HOLDER, str(key_folder), lock_file, str(go)) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held", child.communicate(HARNESS_WAIT_S)
        fd = os.open(key_folder / lock_file, os.O_RDWR | os.O_NOFOLLOW)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        go.write_text("go\n")
        assert child.wait(HARNESS_WAIT_S) == 0
    mode = os.lstat(key_folder / lock_file).st_mode if (key_folder / lock_file).exists() else 0
    assert mode & 0o077 == 0  # the in-flight mark is removed by its holder; the rest 0600


def test_pp_a_start_on_a_linked_ring_lock_says_what_to_do(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """Bug PP, as an operator meets it: a command whose start takes the ring lock, on a
    key folder with a link as ``keks.lock``, stops with exit 1 naming the file and what
    to do, and creates nothing where the link points. main at 2ccadb9a: it created the
    file and ran."""
    env = cli_env(sqlite_store)
    key_dir = settings_for(sqlite_store).key_path
    path = key_dir / "keks.lock"
    path.unlink(missing_ok=True)
    victim = tmp_path / "victim"
    path.symlink_to(victim)
    done = children.run_python(
        children.CLI_SCRIPT, "keys", "rotate", env=env, timeout=HARNESS_WAIT_S
    )
    flat = "".join(_flat(done.stderr).split())
    assert not victim.exists(), "a lock file was created where the link points"
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert f"refusedthelockfile{path}:itisasymboliclink" in flat, done.stderr
    assert "nothingwaschanged" in flat, done.stderr


# ------------------------------------------------------------- PQ: a backup's writer lock


@pytest.fixture
def backups(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "out"
    folder.mkdir()
    yield folder


def test_pq_a_folder_under_a_writer_lock_name_is_left_alone(backups: Path) -> None:
    """Bug PQ. main at 2ccadb9a: ``IsADirectoryError`` from every backup into the folder
    (its sweep of killed backups' partials) and from the residue audit of it."""
    partial = backups / ".bk0.partial-deadbeef"
    partial.mkdir()
    Path(f"{partial}.lock").mkdir()
    assert remove_stale_partials(backups) == []
    assert partial.is_dir() and Path(f"{partial}.lock").is_dir()
    assert [p.path for p in partials(backups)] == [partial]


#: ``remove_stale_partials(argv[1])`` as a user that file modes bind (root drops its
#: capabilities); prints what it removed, or the error's class.
_SWEEP_AS_ANY_USER = _AS_ANY_USER + textwrap.dedent(
    """
    from pathlib import Path
    from uprof.services.backup import remove_stale_partials
    try:
        print("removed", [p.name for p in remove_stale_partials(Path(sys.argv[1]))])
    except Exception as error:
        print("failed", type(error).__name__)
    """
)


def test_pq_a_writer_lock_this_user_cannot_open_is_left_alone(backups: Path) -> None:
    """Bug PQ. main at 2ccadb9a: ``PermissionError`` (another user's lock file, mode
    0600, in a shared backups folder) from every backup into it."""
    partial = backups / ".bk0.partial-deadbeef"
    partial.mkdir()
    lock = Path(f"{partial}.lock")
    lock.touch(mode=0o600)
    lock.chmod(0)
    done = children.run_python(_SWEEP_AS_ANY_USER, str(backups), timeout=HARNESS_WAIT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "removed []", (done.stdout, done.stderr)
    assert partial.is_dir() and lock.exists()


@pytest.mark.parametrize("kind", ["hard-link", "fifo", "another-users-file"])
def test_pq_a_writer_lock_uprof_did_not_make_keeps_its_partial(
    backups: Path, tmp_path: Path, kind: str
) -> None:
    """PQ's rule for the rest (on main these were flocked and, unheld, their partial
    removed, the file they name untouched): whose partial such a lock guards is not
    known, so it is never removed; the file a hard link names is never changed."""
    partial = backups / ".bk0.partial-deadbeef"
    partial.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = _plant(kind, Path(f"{partial}.lock"), elsewhere)
    assert remove_stale_partials(backups) == []
    assert partial.is_dir()
    if kind == "hard-link":
        assert victim.read_text() == PRECIOUS


# ------------------------------------------------ PR: the key folder and its secrets

#: A secret of the key folder, by its name, and how uprof reads (or appends to) it.
SECRETS: dict[str, Callable[[Path], object]] = {
    "master.key": lambda folder: FileKeyMaterialStore(folder).master_secret(),
    "keks.json": lambda folder: FileKeyMaterialStore(folder).load_kek_ring(),
    "audit-signing.pem": lambda folder: FileKeyRing(folder).current(),
    "erasure-ledger.jsonl": lambda folder: FileKeyMaterialStore(folder).append_erasure(
        ErasureRecord(kind="subject", tenant="t", at="2026-01-01T00:00:00Z", stream_id="s")
    ),
}


def _secret_elsewhere(name: str, elsewhere: Path) -> Path:
    """A file ``name`` uprof would accept, made by a start in another key folder."""
    other = elsewhere / "other-keys"
    other.mkdir(mode=0o700)
    SECRETS[name](other)
    return other / name


@pytest.mark.parametrize(
    "kind", ["symlink-to-a-file", "another-users-file", "open-to-others", "fifo"]
)
@pytest.mark.parametrize("name", sorted(SECRETS))
def test_pr_a_key_file_uprof_did_not_make_is_refused_naming_it(
    key_folder: Path, tmp_path: Path, name: str, kind: str
) -> None:
    """Bug PR. main at 2ccadb9a: a link was followed (a master secret, KEK ring or
    signing key chosen by whoever planted it; the ledger's records appended to the file
    it names), another user's file and a master secret or ring readable by every user
    were used, a FIFO hung the start (here: read without ``O_NONBLOCK`` it would
    block, so the FIFO case runs its read in a child)."""
    path = key_folder / name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = _secret_elsewhere(name, elsewhere)
    before = victim.read_bytes()
    if kind == "symlink-to-a-file":
        path.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.write_bytes(before)
        path.chmod(0o600)
        if kind == "another-users-file":
            os.chown(path, 4242, 4242)
        else:  # the ledger holds no secret: refused only when others may write it
            path.chmod(0o666 if name == "erasure-ledger.jsonl" else 0o644)
    done = children.run_python(_READ_SECRET, str(key_folder), name, timeout=HARNESS_WAIT_S)
    assert victim.read_bytes() == before, "the file the key file names was changed"
    said = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert said.startswith(f"refused KeyFileRefusedError refused the key file {path}: it is "), (
        done.stdout,
        done.stderr,
    )


#: Read (or append to) the secret ``argv[2]`` of the key folder ``argv[1]``: prints
#: "read", or "refused <class> <message>".
_READ_SECRET = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.kernel.test_key_folder_locks import SECRETS

    try:
        SECRETS[sys.argv[2]](Path(sys.argv[1]))
        print("read")
    except Exception as error:
        print("refused", type(error).__name__, str(error).replace(chr(10), " "))
    """
)


@pytest.mark.parametrize("kind", ["writable-by-others", "symlink", "another-users"])
def test_pr_a_key_folder_uprof_did_not_make_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    """Bug PR. main at 2ccadb9a: a key folder every user may write (who may then plant
    or swap its keys), a link to one, or another user's, was used without a word."""
    real = tmp_path / "real-keys"
    real.mkdir(mode=0o700)
    folder = tmp_path / "keys"
    if kind == "symlink":
        folder.symlink_to(real)
    else:
        folder.mkdir(mode=0o700)
        if kind == "writable-by-others":
            folder.chmod(0o777)
        else:
            os.chown(folder, 4242, 4242)
    with pytest.raises(AuditKeyError) as refused:  # its KeyFileRefusedError
        FileKeyMaterialStore(folder)
    assert type(refused.value).__name__ == "KeyFileRefusedError"
    assert str(refused.value).startswith(f"refused the key folder {folder}: it is ")
    assert "nothing was changed" in refused.value.diagnostics()
    assert list(real.iterdir()) == []


def test_pr_a_start_on_a_master_secret_others_can_read_says_what_to_do(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
) -> None:
    """Bug PR, as an operator meets it: exit 1 naming the file and ``chmod 600``, no
    traceback. main at 2ccadb9a: the command ran on a master secret every user can read."""
    env = cli_env(sqlite_store)
    path = settings_for(sqlite_store).key_path / "master.key"
    first = children.run_python(
        children.CLI_SCRIPT, "projections", "lag", env=env, timeout=HARNESS_WAIT_S
    )
    assert first.returncode == 0 and path.exists(), first.stderr
    path.chmod(0o644)
    done = children.run_python(
        children.CLI_SCRIPT, "projections", "lag", env=env, timeout=HARNESS_WAIT_S
    )
    flat = "".join(_flat(done.stderr).split())
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert f"refusedthekeyfile{path}:itisopentootherusers(mode0644)" in flat, done.stderr
    assert "nothingwaschanged" in flat, done.stderr
    path.chmod(0o600)
    again = children.run_python(
        children.CLI_SCRIPT, "projections", "lag", env=env, timeout=HARNESS_WAIT_S
    )
    assert again.returncode == 0, again.stderr


def test_pr_a_linked_erasure_ledger_is_never_read(key_folder: Path, tmp_path: Path) -> None:
    """Bug PR. main at 2ccadb9a: the ledger's records were read from whatever a link
    named (a planted ledger without an erasure made every erased subject's name usable
    again; one with records refused subjects never erased)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = _secret_elsewhere("erasure-ledger.jsonl", elsewhere)
    (key_folder / "erasure-ledger.jsonl").symlink_to(victim)
    with pytest.raises(AuditKeyError) as refused:  # its KeyFileRefusedError
        FileKeyMaterialStore(key_folder).erasure_records()
    assert str(refused.value).startswith(
        f"refused the key file {key_folder / 'erasure-ledger.jsonl'}: it is a symbolic link"
    )
