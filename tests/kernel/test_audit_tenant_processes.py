"""A second tenant arriving on the stores, from another process, hides the entries that
name no tenant from the first tenant's audit reads (decision 0089-audit-per-tenant).

While one tenant uses the stores, its audit reads are what they were: entries that name no
tenant (receipt entries written before entries named one) are in its pages, its exports are
the whole trail, and a proof may carry one. Once another tenant's server (here: a real
process of its own, a kernel with another ``UPROF_TENANT``) has written to the shared log,
they are nobody's: the first tenant's pages leave them out, its export is filtered on its
tenant and verifies, and a proof of one is refused as an index beyond the log.
"""

from __future__ import annotations

import io
import json

import pytest

from audit.check import check_upload
from domain.errors import InvalidInputError
from tests.conftest import Backend
from tests.kernel.other_process import run_in_another_process
from uprof.kernel import Uprof

LEGACY = {"action": "erasure.receipt", "receipt_id": "r-legacy", "receipt_sha256": "0" * 64}


def _export(kernel: Uprof) -> tuple[dict[str, object], list[dict[str, object]], str]:
    out = io.StringIO()
    kernel.export_audit(out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return lines[0], [r["entry"] for r in lines if r["kind"] == "entry"], out.getvalue()


def test_a_second_tenant_from_another_process_hides_untagged_entries(
    kernel: Uprof, backend: Backend
) -> None:
    legacy = kernel.audit_log.append(LEGACY).leaf_index  # as a receipt before 2026-12-05
    kernel.audit.record("subject.exported", subject_ref="subj_mine")
    # One tenant: reads as before.
    assert legacy in [e.leaf_index for e in kernel.audit_entries()]
    header, entries, text = _export(kernel)
    assert header["filter"] == {} and any(e.get("receipt_id") == "r-legacy" for e in entries)
    assert kernel.audit_proof(1, leaf_index=legacy)["inclusion"]["leaf_index"] == legacy

    done = run_in_another_process(
        backend,
        """
        settings = kernel.settings.model_copy(update={"tenant": "other-tenant"})
        other = build_kernel(settings, FakeClock())
        try:
            other.audit.record("subject.exported", subject_ref="subj_theirs")
        finally:
            other.close()
        """,
    )
    assert done.returncode == 0, done.stderr

    seen = list(kernel.audit_entries())
    assert legacy not in [e.leaf_index for e in seen]
    assert {e.entry.get("tenant") for e in seen} == {kernel.settings.tenant}
    header, entries, text = _export(kernel)
    assert header["filter"] == {"tenant": kernel.settings.tenant}
    assert {e.get("tenant") for e in entries} == {kernel.settings.tenant}
    log = kernel.audit_log
    assert check_upload(text.encode(), "export", log.public_key, log.origin).ok
    with pytest.raises(InvalidInputError) as refused:
        kernel.audit_proof(1, leaf_index=legacy)
    assert refused.value.field == "leaf_index"
