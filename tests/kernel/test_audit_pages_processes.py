"""Two processes page through the audit trail while a third writes (decision 0094).

Attack review of 2026-12-05, real processes on both backends: each reader walks every page
of the trail with its cursors (a page of 7, its read recorded each time, as every surface
does through ``Facade.list_audit_entries``) while a writer appends entries as fast as it can,
and the other reader's ``audit.read`` entries land in the log too. Each walk must end, show
every entry below its own bound exactly once and in leaf order (nothing the writer or the
other reader appended meanwhile), and have exactly one ``audit.read`` per page, all with
its bound. (Held on b9280be: kept as a guard.)
"""

from __future__ import annotations

import json

from tests.children import PythonChild
from tests.conftest import Backend
from uprof.kernel import Uprof

_PRELUDE = """
import dataclasses, json, os, sys
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from domain.principal import Principal
from uprof.facade import Facade

backend = Backend({kind!r}, {url!r}, Path({data!r}))
kernel = build_kernel(settings_for(backend), FakeClock())
"""

_READER = """
try:
    reader = dataclasses.replace(
        Principal.local_operator(kernel.subjects.tenant), key_id=sys.argv[1]
    )
    door = Facade(kernel, reader)
    walk, cursor = [], None
    while True:
        page = door.list_audit_entries(cursor=cursor, limit=7)
        walk.append([e.leaf_index for e in page.items])
        cursor = page.next_cursor
        if cursor is None:
            break
    print(json.dumps(walk))
finally:
    kernel.close()
"""

_WRITER = """
try:
    print("ready", flush=True)
    for i in range(150):
        kernel.audit.record("subject.exported", subject_ref=f"subj_w{i}")
finally:
    kernel.close()
"""


def test_two_readers_page_while_a_third_process_writes(kernel: Uprof, backend: Backend) -> None:
    for i in range(60):
        kernel.audit.record("consent.granted", subject_ref=f"subj_s{i}")
    prelude = _PRELUDE.format(kind=backend.kind, url=backend.url, data=str(backend.data_dir))
    writer = PythonChild(prelude + _WRITER, stream_stdout=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    names = ("reader1", "reader2")
    readers = [PythonChild(prelude + _READER, name) for name in names]
    walks = {}
    for name, reader in zip(names, readers, strict=True):
        out, err = reader.communicate(timeout=300)
        assert reader.returncode == 0, err[-3000:]
        walks[name] = json.loads(out.strip().splitlines()[-1])
    out, err = writer.communicate(timeout=300)
    assert writer.returncode == 0, err[-3000:]

    reads = [e.entry for e in kernel.audit_entries(action="audit.read")]
    for name, walk in walks.items():
        mine = [r for r in reads if r["principal"] == f"operator:local#{name}"]
        assert len(mine) == len(walk), "one audit.read per page"
        (bound,) = {r["tree_size"] for r in mine}
        shown = [leaf for page in walk for leaf in page]
        expected = [e.leaf_index for e in kernel.audit_entries(tree_size=bound)]
        assert shown == expected, "every entry below the walk's bound once, in order"
        assert [r["counts"]["entries"] for r in mine] == [len(page) for page in walk]
        assert mine[-1]["counts"]["to_leaf"] == bound
    assert len(reads) == sum(len(walk) for walk in walks.values())
