"""What held in the review of decision 0151-verifier-attacks (docs/decisions/
0154-review-of-0151.md), kept as tests: tenant names as the verifier compares them, the
other hashes of the code base that join variable parts, and the process-wide CSV field
limit. The defects found (JQ, JR) are tested in tests/api/test_review_of_0151.py.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from audit.check import check_upload
from audit.export_format import MAX_LINE_BYTES, read_csv_rows
from audit.keys import public_key_pem
from audit.log import AuditLog
from audit.receipts import new_commitment_nonce
from domain.errors import InvalidInputError
from domain.profile import _new_id
from domain.values import check_token
from tests.audit.conftest import ORIGIN
from tests.audit.test_verifier_attacks_round_2 import issue_for, refused, run_cli
from uprof.services.subjects import check_subject_ref


@pytest.mark.parametrize(
    "asked",
    [
        "Acme",
        "ACME",
        "acme ",
        " acme",
        "\u0430cme",
        "acm\u0435",
        "\uff41\uff43\uff4d\uff45",
        "acme\u200b",
        "",
    ],
)
def test_a_tenant_is_compared_as_signed_never_folded(
    sqlite_log: AuditLog, tmp_path: Path, asked: str
) -> None:
    """Tenants are the exact configured string (the key store and the policy key on it:
    ``Acme`` and ``acme`` are two tenants), and the issuer takes ASCII tokens only. So
    ``--tenant`` with another case, a blank, a Cyrillic or full-width look-alike or a
    zero-width space is refused with both names; the verdict without ``--tenant`` shows
    the tenant JSON-escaped (a look-alike could not pass as ASCII)."""
    receipt = issue_for(sqlite_log, "ana", new_commitment_nonce(), tenant="acme")
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    pinned = ["--public-key", str(key), "--origin", ORIGIN]
    answer = run_cli("verify-receipt", str(path), *pinned, "--tenant", asked)
    assert refused(answer), answer.output
    assert "'acme'" in " ".join(answer.output.split()), answer.output
    shown = run_cli("verify-receipt", str(path), *pinned)
    assert shown.exit_code == 0 and 'tenant "acme"' in " ".join(shown.output.split())
    # The upload check, asked as that tenant's, refuses it as well.
    raw = path.read_bytes()
    checked = check_upload(raw, "receipt", sqlite_log.public_key, ORIGIN, tenant=asked)
    assert not checked.ok and "'acme'" in checked.detail


def test_the_other_joined_hashes_split_one_way() -> None:
    """The sweep of the code base for hashes over joined parts (decision: held). Each
    joins with a separator that no part but the last may hold, or parts of one fixed
    length: idempotency and erased-ref tokens (0147) and the key store's subject and
    alias hashes and the ledger's marks join with U+001F after tokens (tenant, app id,
    namespace) that cannot contain it; capture-key commitments join a 32-hex-digit
    capture id; API key digests join a 16-hex-digit key id with ":"."""
    for bad in ("a\x1fb", "a\x00b", "a:b\x1f"):
        with pytest.raises(InvalidInputError):
            check_token("app_id", bad)
    ids = {_new_id() for _ in range(50)}
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and len(ids) == 50
    # A subject id may hold U+001F, but only as the last part of those joins.
    assert check_subject_ref("a\x1fb") == "a\x1fb"


def test_the_csv_field_limit_is_fixed_and_reading_never_moves_it(tmp_path: Path) -> None:
    """IY's reader raised the process-wide limit to each line it read; KY fixed it once, at
    import, to the line cap (``MAX_LINE_BYTES``), so a hostile upload cannot move it at all
    (POST /v1/audit/verify: tests/api/test_line_cap_uploads.py)."""
    before = csv.field_size_limit()
    cell = "x" * (128 * 1024 + 1000)
    rows = list(read_csv_rows([f"entry,{cell}\n"]))
    assert rows == [["entry", cell]]
    rows = list(read_csv_rows(["a,b\n"]))
    assert rows == [["a", "b"]] and csv.field_size_limit() == before == MAX_LINE_BYTES
