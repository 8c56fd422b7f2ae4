"""The REST door (``uprof serve`` on loopback, a real process) beside another process's
``projections rebuild`` held just after its reset (SQLite and PostgreSQL; decision
0241-doors-beside-a-rebuild). 0240-readers-beside-a-rebuild drove the kernel's reads
embedded; this drives the same scenario through a running server.

The scenario is 0236's: an item erasure killed between its ledger record and its
``ItemsErased`` leaves the item's events in the log, so a replay lists it again until
a reader erases it again. The server's reads (profile, export, slice) while the views
are reset must not name the item, and the views must end equal to a rebuild from the
log. No sleep decides anything: each step waits on a file or on the server's health.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from benchmarks.server_ready import stop_server, wait_until_healthy
from tests.api.conftest import PRIVACY
from tests.api.mcp_messages import HELLO, rpc
from tests.api.test_mcp_stdio_message_limit import _Answers
from tests.children import PythonChild, serving_child
from tests.conftest import Backend
from tests.e2e.test_review_0232_readiness import _stopped, _worker
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    APP,
    SAIL,
    build_kernel,
    consent,
    running,
    sail_intent_of_alice,
    say,
    settings_for,
)
from tests.kernel.test_erasure_leftovers import _killed_after_record
from tests.kernel.test_readers_beside_a_rebuild import _REBUILD_HELD_IN_ITS_REPLAY
from tests.kernel.test_review_0232_views_halfway import _let_go, _listed, _rebuild_child
from tests.kernel.test_start_beside_a_rebuild import WAIT_S, _wait_for
from tests.web.conftest import open_link
from uprof.settings import Settings

READS: dict[str, tuple[str, dict[str, object]]] = {
    "profile": ("/v1/profile/read", {"subject": "alice"}),
    "export": ("/v1/governance/exports", {"subject": "alice"}),
    "slice": (
        "/v1/slices",
        {
            "subject": "alice",
            "query": f"learn to {SAIL}",
            "budget_tokens": 512,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    ),
}


def _serve(settings: Settings, stderr: Path) -> tuple[PythonChild, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
    }
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    # Forked from the tests' fork server (the project imported once): a process of its
    # own all the same, its start the command's.
    process, port = serving_child(["serve", "--log-level", "warning"], env, stderr)
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(process, url, timeout_s=120)
    return process, url


#: The privacy center's pages alice reads, signed in by her link.
PAGES = {"privacy page": "/privacy", "privacy export": "/privacy/export.json"}


def _read_all(
    url: str, tokens: dict[str, str], browser: httpx.Client
) -> dict[str, tuple[int, str]]:
    """Each read's status and body (the export by the privacy console's key, which has
    the ``dpo`` role; the others by the planner's operator key; the privacy center's
    pages by alice's signed-in browser)."""
    answers = {}
    for name, page in PAGES.items():
        answer = browser.get(page)
        answers[name] = (answer.status_code, answer.text)
    for name, (path, body) in READS.items():
        headers = {"Authorization": f"Bearer {tokens[name]}"}
        answer = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=WAIT_S)
        answers[name] = (answer.status_code, answer.text)
    return answers


def test_held_rest_reads_beside_a_rebuild_held_at_its_reset(
    backend: Backend, tmp_path: Path
) -> None:
    """A running ``uprof serve`` answers profile, export and slice while another
    process's rebuild has reset the views (the erasure killed after its ledger record):
    no answer names the item, then or after the rebuild, and the views end equal to a
    rebuild from the log."""
    from uprof.api import ApiKeyStore

    settings, clock = settings_for(backend), FakeClock()
    with running(settings, clock) as setup:
        intent = sail_intent_of_alice(setup)
    keys = ApiKeyStore.open(settings)
    try:
        operator = keys.create(APP, ["app", "operator"]).token
        token = {"profile": operator, "slice": operator, "export": keys.create(PRIVACY).token}
    finally:
        keys.close()
    process, url = _serve(settings, tmp_path / "serve.stderr")
    browser = httpx.Client(base_url=url, timeout=WAIT_S)
    try:
        issued = httpx.post(
            f"{url}/v1/privacy/links",
            headers={"Authorization": f"Bearer {operator}"},
            json={"subject": "alice"},
            timeout=WAIT_S,
        )
        assert issued.status_code == 201, issued.text
        open_link(browser, issued.json()["login_path"])
        before = _read_all(url, token, browser)
        assert all(code == 200 for code, _ in before.values()), {
            n: (c, t[:300]) for n, (c, t) in before.items() if c != 200
        }
        assert all(intent.item_id in text for _, text in before.values()), before
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            _killed_after_record(settings, "item", intent.item_id)
            signals["start"].touch()
            assert _wait_for(signals["reset"], child, WAIT_S), "the rebuild never reset"
            halfway = _read_all(url, token, browser)
        finally:
            _let_go(child, signals)
        after = _read_all(url, token, browser)
    finally:
        browser.close()
        stop_server(process)
    # Answered, not refused: the reads ran over the reset views.
    assert {name: code for name, (code, _) in halfway.items()} == dict.fromkeys(
        [*PAGES, *READS], 200
    )
    served = [name for name, (_, text) in halfway.items() if intent.item_id in text]
    assert not served, f"served halfway through another process's replay: {served} {halfway}"
    assert all(code == 200 for code, _ in after.values()), after
    assert not [name for name, (_, text) in after.items() if intent.item_id in text], after
    with running(settings, clock) as kernel:
        assert kernel.ensure_fresh(10)
        assert not _listed(kernel, intent.item_id)
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live


#: Subjects captured while the rebuild is held: enough that both partitions hold some.
OTHERS_AT_MOST = [f"subject-{n}" for n in range(40)]


def test_held_partition_workers_beside_a_rebuild_held_in_its_replay(
    backend: Backend, tmp_path: Path
) -> None:
    """Two ``uprof worker --partitions 2 --partition K`` processes run while another
    process's rebuild has reset the views and read its first batch (the log up to the
    item). The test's process (a server's settings: background workers, none of its own)
    erases the item, its receipt issued once the workers passed the erasure, and captures
    for subjects of both partitions, which the workers project. Let go, the rebuild's
    stale batch must not list the item again nor project anything twice: the views end
    equal to a rebuild from the log."""
    settings = settings_for(backend).model_copy(update={"worker_partitions": 2})
    with running(settings, FakeClock()) as setup:
        intent = sail_intent_of_alice(setup)
        # Streams get random ids, so six subjects all land in one partition once in 32
        # (a clean-clone CI met it): subjects are added until both partitions have one.
        others: list[str] = []
        partitions: set[int] = set()
        for subject in OTHERS_AT_MOST:
            consent(setup, subject)
            others.append(subject)
            partitions.add(setup.extraction._partitioning.of(setup.stream_of(subject)))
            if len(others) >= 6 and partitions == {0, 1}:
                break
        setup.process()
    assert partitions == {0, 1}  # the captures below reach both workers
    applying, go = tmp_path / "applying", tmp_path / "go"
    workers = [_worker(backend, partition) for partition in (0, 1)]
    served = settings.model_copy(update={"background_workers": True, "run_worker": False})
    kernel = build_kernel(served, FakeClock())
    try:
        child = PythonChild(
            _REBUILD_HELD_IN_ITS_REPLAY,
            backend.kind,
            backend.url,
            str(backend.data_dir),
            str(applying),
            str(go),
            "2",
        )
        try:
            assert _wait_for(applying, child, WAIT_S), "the rebuild never read a batch"
            result = kernel.erase_item("alice", intent.item_id)
            assert result.receipt is not None
            for subject in others:
                kernel.capture(subject, say(f"I live in Porto, says {subject}", ref=subject))
            # The workers, not this process, project the captures beside the held rebuild.
            assert kernel.ensure_fresh(WAIT_S), "the partition workers never caught up"
            assert child.poll() is None  # the rebuild still held while they did
        finally:
            go.touch()
            out, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == 0, err[-3000:]
        assert kernel.ensure_fresh(WAIT_S)
        assert not _listed(kernel, intent.item_id), (
            f"the rebuild listed the erased item again after its receipt ({out})"
        )
        assert intent.item_id not in str(kernel.export_subject("alice"))
    finally:
        kernel.close()
        for worker in workers:
            _stopped(worker)
    with running(settings, FakeClock()) as after:
        assert after.ensure_fresh(10)
        assert not _listed(after, intent.item_id)
        live = after.queries.table_digest()
        after.rebuild()
        assert after.queries.table_digest() == live


#: What the MCP door is asked: the slice tool and the profile resource.
MCP_READS = {
    "profile_slice": (
        "tools/call",
        {"name": "profile_slice", "arguments": {**READS["slice"][1]}},
    ),
    "profile resource": ("resources/read", {"uri": "uprof://profile/alice"}),
}


def test_held_mcp_reads_beside_a_rebuild_held_at_its_reset(
    backend: Backend, tmp_path: Path
) -> None:
    """A running ``uprof mcp --transport stdio`` (a real process, the planner's operator
    key) answers the slice tool and the profile resource while another process's rebuild
    has reset the views (the erasure killed after its ledger record): no answer names
    the item, then or after, and the views end equal to a rebuild from the log."""
    from uprof.api import ApiKeyStore

    settings, clock = settings_for(backend), FakeClock()
    with running(settings, clock) as setup:
        intent = sail_intent_of_alice(setup)
    keys = ApiKeyStore.open(settings)
    try:
        token = keys.create(APP, ["app", "operator"]).token
    finally:
        keys.close()
    args = [sys.executable, "-m", "uprof.mcp", "--data-dir", str(settings.data_dir)]
    args += ["--embedder", "hashing"]
    args += ["--database-url", backend.url] if settings.database_url else []
    args += ["mcp", "--transport", "stdio"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {"UPROF_API_KEY": token, "HF_HUB_OFFLINE": "1"}
    mcp = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    sent = iter(range(2, 1000))

    def ask_all() -> dict[str, str]:
        assert mcp.stdin is not None
        out = {}
        for name, (method, params) in MCP_READS.items():
            mcp.stdin.write(rpc(method, next(sent), params).encode() + b"\n")
            mcp.stdin.flush()
            out[name] = json.dumps(answers.next())
        return out

    try:
        assert mcp.stdin is not None
        answers = _Answers(mcp)
        mcp.stdin.write(json.dumps(HELLO).encode() + b"\n")
        mcp.stdin.flush()
        assert answers.next()["id"] == 1
        mcp.stdin.write(rpc("notifications/initialized").encode() + b"\n")
        mcp.stdin.flush()
        before = ask_all()
        assert all(intent.item_id in text for text in before.values()), before
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            _killed_after_record(settings, "item", intent.item_id)
            signals["start"].touch()
            assert _wait_for(signals["reset"], child, WAIT_S), "the rebuild never reset"
            halfway = ask_all()
        finally:
            _let_go(child, signals)
        after = ask_all()
    finally:
        if mcp.stdin is not None:
            mcp.stdin.close()
        try:
            mcp.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            mcp.kill()
            mcp.wait()
        if mcp.stdout is not None:
            mcp.stdout.close()
    for when, answered in (("halfway", halfway), ("after", after)):
        # Answered, not refused: a result, and no tool error in it.
        results = [json.loads(text).get("result") for text in answered.values()]
        assert all(r is not None and not r.get("isError") for r in results), answered
        assert not [n for n, text in answered.items() if intent.item_id in text], (when, answered)
    with running(settings, clock) as kernel:
        assert kernel.ensure_fresh(10)
        assert not _listed(kernel, intent.item_id)
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
