"""Review of decisions 0174, 0176 and 0177 (reviews that were not reviewed in turn), as an
outside attacker, on SQLite and PostgreSQL: the web and door side. Each bug's test failed
on main before its fix; the attacks that held are kept too."""

from __future__ import annotations

import httpx
import pytest

from domain.errors import InvalidInputError
from domain.principal import Principal
from tests.api.conftest import Apps, LiveServer
from uprof.facade import Facade
from uprof.kernel import Uprof


@pytest.mark.parametrize("term", ["Zq7\x00", "\x00", "Zq7\udcff"])
def test_mw_a_residue_term_that_is_not_text_is_refused_naming_it(kernel: Uprof, term: str) -> None:
    """Bug MW (0176's ME refused a blank term, not one no store can look for). A term
    holding a NUL character crashed the PostgreSQL scan (``psycopg.DataError``: text
    cannot contain NUL), a 500 from the console; a lone surrogate (what Python makes of a
    byte that is not UTF-8 in a command line: ``uprof audit residue --term $'\\xff'``)
    failed the file scan on both backends ("the file scan failed ... surrogates not
    allowed"), naming no field. The door refuses both as it refuses a blank term: 422 /
    exit 2, naming ``terms`` and its place, before anything is read."""
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    with pytest.raises(InvalidInputError) as refused:
        door.residue_scan(["Zq7-never-said", term])
    assert refused.value.field == "terms"
    assert "terms[1]" in str(refused.value)


@pytest.mark.parametrize("term", ["\u200b", "\ufeff", "\u00a0Zq7"])
def test_a_residue_term_of_invisible_characters_is_looked_for(kernel: Uprof, term: str) -> None:
    """Held (ME): a term that is not blank to ``str.strip`` (a zero-width space, a BOM)
    or holds a no-break space is text a store may hold: it is looked for, and an empty
    store holds none of it (no term normalises to blank: the scan only adds its lower
    and upper case)."""
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    report = door.residue_scan([term])
    assert report.clean, report.findings[:3]


def test_mw_the_console_refuses_a_nul_term_as_bad_input(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    """Bug MW through the console: a NUL in the residue form (``%00``) answered 500 on
    PostgreSQL; now 422, the form keeps what was typed."""
    from tests.web.conftest import csrf_of

    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/receipts").text)
        refused = console.post("/console/residue", data={"csrf": csrf, "terms": "Zq7\nZq8\x00"})
        assert refused.status_code == 422, refused.text[-300:]
        assert "terms[1]" in refused.text
