"""Review of decisions 0174, 0176 and 0177 (reviews that were not reviewed in turn), as an
outside attacker, on SQLite and PostgreSQL, with real processes: the kernel and CLI side.
Each bug's test failed on main before its fix; the attacks that held are kept too."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests import children
from tests.conftest import OTHER_TENANT, Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, other_tenant, running, settings_for
from tests.kernel.test_erasure_leftovers import OTHER_HOST, SETTLE, _cli_env, _erase_on_other_host


def test_settle_host_settles_another_tenants_dead_request_in_that_tenants_trail(
    backend: Backend, tmp_path: Path
) -> None:
    """Held (0174's Left: no test settled another tenant's request through settle-host).
    Tenant B's erasure SIGKILLed on a host gone for good after its ``erasure.requested``;
    tenant A's operator runs ``uprof erase settle-host`` (a real CLI process). The
    ``erasure.abandoned`` entry names B (the request's own entry's tenant): B's trail
    shows the outcome, A's holds neither B's pseudonym nor its request id."""
    settings = settings_for(backend)
    theirs = other_tenant(settings, tmp_path)
    with running(theirs, FakeClock()) as setup:
        consent(setup, "alice")
    dead = children.CONTEXT.Process(target=_erase_on_other_host, args=(theirs, None, None))
    dead.start()
    dead.join(120)
    assert dead.exitcode == -signal.SIGKILL
    done = children.run_python(
        SETTLE, "erase", "settle-host", OTHER_HOST, "--yes", env=_cli_env(settings)
    )
    assert done.returncode == 0 and "settled 1" in " ".join(done.stdout.split()), done
    ours = build_kernel(settings, FakeClock())
    try:
        (requested,) = [e.entry for e in ours.audit_log.entries(action="erasure.requested")]
        (abandoned,) = [e.entry for e in ours.audit_log.entries(action="erasure.abandoned")]
        assert abandoned["request_id"] == requested["request_id"]
        assert abandoned["reason_code"] == "host-gone"
        assert (requested["tenant"], abandoned["tenant"]) == (OTHER_TENANT, OTHER_TENANT)
        assert list(ours.audit_entries(action="erasure.abandoned")) == []
        assert list(ours.audit_entries(action="erasure.requested")) == []
    finally:
        ours.close()
    with running(theirs, FakeClock()) as other:
        (seen,) = [e.entry for e in other.audit_entries(action="erasure.abandoned")]
        assert seen["request_id"] == requested["request_id"]


def test_a_receipt_of_another_deployment_or_edited_is_refused_by_prove_and_verify(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held (0177, MK and ML take a receipt as the reader's own point): a receipt another
    deployment issued (its own key), and this deployment's receipt edited (its inclusion's
    tree size moved beyond the log; its checkpoint's size line changed) are refused by
    ``audit prove --from`` and ``audit verify --trusted-checkpoint``: exit 1, saying
    why, no traceback, on both backends."""
    import json

    from tests.kernel.test_admin_audit import cli_for
    from tests.kernel.test_keys_apart import ALICE, BOB, fill
    from tests.kernel.test_retired_below_review import verify_trail
    from uprof.settings import Settings

    run = cli_for(backend)
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        ours = k.erase_subject("alice").receipt
        fill(k, "bob", BOB)
    elsewhere = Settings(data_dir=tmp_path / "elsewhere", embedder="hashing")
    with running(elsewhere, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        theirs = k.erase_subject("bob").receipt
    beyond = {**ours, "inclusion": {**ours["inclusion"], "tree_size": 10**6}}
    size = ours["inclusion"]["tree_size"]
    lines = ours["checkpoint"].split("\n")
    assert lines[1] == str(size)
    resized = {**ours, "checkpoint": "\n".join([lines[0], str(size + 1), *lines[2:]])}
    verify = [*verify_trail(run, tmp_path), "--trusted-checkpoint"]
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    run(*verify, str(tmp_path / "ours.json"))  # the honest one is taken
    cases = (
        ("theirs", theirs, "issuer.key_id is not the id of the pinned public key"),
        ("beyond", beyond, "inclusion is for tree size 1000000"),
        ("resized", resized, "checkpoint signature by the pinned key does not verify"),
    )
    for name, receipt, why in cases:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(receipt))
        proved = " ".join(
            run(
                "audit", "prove", "--from", str(path), "--out", str(tmp_path / "p.json"), code=1
            ).split()
        )
        assert "not a checkpoint of this log" in proved and why in proved, (name, proved)
        verified = " ".join(run(*verify, str(path), code=1).split())
        assert why in verified, (name, verified)


def test_an_operator_vouched_restore_entry_verifies_in_both_export_formats(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held (0177, MJ): the ``backup.restored`` entry of a restore on the operator's word
    (``decision`` ``operator-vouched``, ``rule``, the retired key's ``audit_key_id``) is
    allowlisted: the whole trail, exported as JSONL and as CSV after the restore, verifies
    offline with the key history, and the entry is in both files with its fields."""
    import json

    from tests.kernel.test_admin_audit import cli_for
    from tests.kernel.test_retired_below_review import _backup_then_rotate, verify_trail
    from uprof.services.backup import restore

    settings = settings_for(backend)
    _backup_then_rotate(settings, clock, tmp_path / "old")
    restore(settings, tmp_path / "old", allow_unsigned=True)
    run = cli_for(backend)
    for fmt in ("jsonl", "csv"):
        out = run(*verify_trail(run, tmp_path, fmt))
        assert "verified" in out, out
        text = (tmp_path / f"trail.{fmt}").read_text()
        assert text.count("operator-vouched") == 1 and "manifest-retired-key" in text, fmt
    (line,) = [x for x in (tmp_path / "trail.jsonl").read_text().splitlines() if "vouched" in x]
    entry = json.loads(line)["entry"]
    assert (entry["action"], entry["decision"]) == ("backup.restored", "operator-vouched")


def test_a_receipt_of_a_copied_folder_is_refused_by_the_original(
    clock: FakeClock, tmp_path: Path
) -> None:
    """Held (0177, a copied folder): the data and key folders copied while stopped, and
    the copy run on its own: its receipts are signed by the same audit key, for the same
    origin. The original, grown on its own too, refuses a receipt of the copy as the
    reader's own point (``audit prove --from``, ``audit verify --trusted-checkpoint``):
    its log does not extend the copy's tree, a fork. SQLite only: a PostgreSQL copy is
    another database, the same fork for these commands."""
    import json
    import shutil

    from typer.testing import CliRunner

    from tests.kernel.test_keys_apart import ALICE, BOB, fill
    from uprof.cli.main import app as cli
    from uprof.settings import Settings

    original = Settings(data_dir=tmp_path / "a" / "data", embedder="hashing")
    with running(original, clock) as k:
        fill(k, "alice", ALICE)
    copy = Settings(data_dir=tmp_path / "b" / "data", embedder="hashing")
    shutil.copytree(original.data_dir, copy.data_dir)
    shutil.copytree(original.key_path, copy.key_path)
    with running(copy, clock) as k:
        fill(k, "bob", BOB)
        forked = k.erase_subject("bob").receipt
    with running(original, clock) as k:
        fill(k, "carol", BOB)
        fill(k, "dave", BOB)

    def run(*args: str) -> tuple[int, str]:
        done = CliRunner().invoke(
            cli, ["--data-dir", str(original.data_dir), "--embedder", "hashing", *args]
        )
        return done.exit_code, " ".join(done.output.split())

    held = tmp_path / "forked.json"
    held.write_text(json.dumps(forked))
    code, out = run("audit", "prove", "--from", str(held), "--out", str(tmp_path / "p.json"))
    assert code == 1 and "does not extend" in out, out
    for step in (["export", "--out", str(tmp_path / "t.jsonl")],
                 ["public-key", "--out", str(tmp_path / "k.pem")],
                 ["keys", "--out", str(tmp_path / "keys.json")]):  # fmt: skip
        assert run("audit", *step)[0] == 0
    code, out = run(
        "audit", "verify", str(tmp_path / "t.jsonl"),
        "--public-key", str(tmp_path / "k.pem"), "--key-history", str(tmp_path / "keys.json"),
        "--trusted-checkpoint", str(held),
    )  # fmt: skip
    assert code == 1 and "do not hash to the root of the trusted checkpoint" in out, out


def test_mx_settle_host_refuses_a_host_name_that_is_not_text(backend: Backend) -> None:
    """Bug MX: ``uprof erase settle-host`` refused an empty host or one with spaces
    (naming ``host``), but a host name holding a byte that is not UTF-8 (what Python makes
    of ``$'\\xff'`` in a command line: a lone surrogate) reached the in-flight marks,
    where encoding it raised ``UnicodeEncodeError``: a traceback, exit 1, as soon as a
    dead request was open. Now refused as bad input, exit 2, naming ``host``; the dead
    request is left for a run with the right name (a real CLI process, both backends)."""
    settings = settings_for(backend)
    with running(settings, FakeClock()) as setup:
        consent(setup)
    dead = children.CONTEXT.Process(target=_erase_on_other_host, args=(settings, None, None))
    dead.start()
    dead.join(120)
    assert dead.exitcode == -signal.SIGKILL
    env = _cli_env(settings)
    for host in (OTHER_HOST + "\udcff", "\udcff"):
        done = children.run_python(SETTLE, "erase", "settle-host", host, "--yes", env=env)
        said = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2 and "host" in said, said[-600:]
        assert "Traceback" not in said, said[-600:]
    done = children.run_python(SETTLE, "erase", "settle-host", OTHER_HOST, "--yes", env=env)
    assert done.returncode == 0 and "settled 1" in " ".join(done.stdout.split()), done


def test_a_pre_rotation_receipt_serves_a_csv_trail_and_another_leaf(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held (0177, MK and ML beyond their tests): the honest receipt issued before the
    audit key's rotation is the trusted checkpoint of a CSV trail too, and ``audit prove
    --from`` it with another entry's ``--leaf-index`` (its note then the point checked)
    proves the log extends it."""
    from tests.kernel.test_retired_below_review import _receipt_then_rotation, verify_trail

    run, _settings, receipt, _leaked, _origin, _copied = _receipt_then_rotation(
        backend, clock, tmp_path
    )
    verify = verify_trail(run, tmp_path, "csv")
    out = run(*verify, "--trusted-checkpoint", str(tmp_path / "receipt.json"))
    assert "extends 1 trusted checkpoint" in " ".join(out.split()), out
    other = "0" if receipt["inclusion"]["leaf_index"] else "1"
    out = run(
        "audit", "prove", "--from", str(tmp_path / "receipt.json"),
        "--leaf-index", other, "--out", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert f"extends {receipt['inclusion']['tree_size']}, entry {other} included" in out, out


def test_na_a_subject_named_with_bytes_that_are_not_utf8_is_refused_naming_it(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug NA (MX's class, in every command naming a subject): ``--subject $'al\\xffice'``
    (a lone surrogate once Python reads the command line) passed ``check_subject_ref``,
    which refused only NUL, and raised ``UnicodeEncodeError`` where the reference is
    hashed: a traceback, exit 1, for ``profile show``, ``consent list``, ``export-subject``
    and ``erase subject``. The one owner of a subject reference now refuses it as bad
    input naming ``subject`` (exit 2); nothing is read or written."""
    from tests.kernel.test_admin_audit import cli_for

    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k)
        before = k.audit_log.size()
    run = cli_for(backend)
    for command in (
        ["profile", "show"],
        ["consent", "list"],
        ["export-subject", "--out", str(tmp_path / "alice.json")],
        ["erase", "subject"],
    ):
        said = " ".join(run(*command, "--subject", "al\udcffice", code=2).split())
        assert "subject" in said and "Unicode" in said, (command, said)
    with running(settings, clock) as k:
        erasures = list(k.audit_log.entries(action="erasure.requested"))
        assert erasures == [] and k.audit_log.size() >= before
    assert not (tmp_path / "alice.json").exists()


def test_nb_an_export_filter_its_verifier_refuses_is_refused_before_writing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug NB (0174: can an honest export hold what its own reader refuses?). The
    verifier checks the header's filter values with the entry allowlist (an ``app_id``
    token, an ``action`` name), the exporter took any text: ``uprof audit export --app
    'a b'`` or ``--action x/y`` (REST's ``Token`` allows ``/``, ``*``, a leading digit,
    none of them in an action name) wrote, signed and audited an export that every
    verifier refuses ("filter app_id: ... must be a token"). The exporter now checks the
    filter with the verifier's own check, before anything is written or audited."""
    from domain.errors import InvalidInputError
    from domain.principal import Principal
    from tests.kernel.test_admin_audit import cli_for
    from uprof.facade import Facade

    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k)
    run = cli_for(backend)
    trail = tmp_path / "t.jsonl"
    for option, value, field in (
        ("--app", "a b", "app_id"),
        ("--app", "x" * 201, "app_id"),
        ("--action", "x/y", "action"),
        ("--action", "9lives", "action"),
    ):
        said = " ".join(run("audit", "export", "--out", str(trail), option, value, code=2).split())
        assert f"filter {field}" in said, (option, value, said)
        assert not trail.exists()
    with running(settings, clock) as k:
        assert list(k.audit_log.entries(action="audit.exported")) == []
        door = Facade(k, Principal.local_operator(k.subjects.tenant))
        with pytest.raises(InvalidInputError, match="filter action"):
            door.stream_audit(action="x/y")  # REST's path: refused before the first byte
    run("audit", "export", "--out", str(trail), "--action", "consent.granted")
    run("audit", "public-key", "--out", str(tmp_path / "k.pem"))
    assert "verified" in run("audit", "verify", str(trail), "--public-key", str(tmp_path / "k.pem"))
