"""An import file of one tenant run in another (decision 0144-import-and-adapters-attacks;
held, both backends): subjects are resolved in the running tenant, so an export of tenant A
imported into tenant B reaches nobody of A's, creates nobody in B without B's consent,
and a record naming A's subject by its pseudonym is a stranger to B."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, other_tenant, running, settings_for
from tests.kernel.test_import_idempotency import record
from uprof.services.importer import import_interactions


def test_an_export_of_one_tenant_imported_into_another_reaches_nobody_of_the_first(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    other = other_tenant(settings, tmp_path)
    lines = [record("I like tea", ref="r-1"), record("I live in Porto", ref="r-2")]
    with running(settings, clock) as a:
        consent(a)
        assert import_interactions(a, lines).captured == 2
        handle = a.subjects.find("alice")
        assert handle is not None
        pseudonym = handle.pseudonym
    by_pseudonym = json.loads(lines[0]) | {"subject": pseudonym, "source_ref": "r-3"}
    with running(other, clock) as b:
        refused = import_interactions(b, [*lines, json.dumps(by_pseudonym)])
        assert refused.captured == 0 and len(refused.failed) == 3, refused
        assert {p.field for p in refused.failed} == {"subject"}
        assert b.subjects.find("alice") is None
        # With B's own consent of its own alice, the same refs are B's to capture once.
        consent(b)
        assert import_interactions(b, lines).captured == 2
        assert import_interactions(b, lines).skipped == 2
    with running(settings, clock) as a:
        a.process()
        assert import_interactions(a, lines).skipped == 2  # A's alice untouched
