"""A KEK rotation killed while it writes the ring leaves no copy of the KEKs it was to
forget (both backends: the ring is in the key folder on both; a real process killed).

The ring is written to a temporary file, fsynced, then renamed over ``keks.json``. A
rotation killed between the two left the temporary file: every KEK of the ring, the old
epochs included, in the key folder. The next rotation forgot the old epochs in
``keks.json`` and nowhere else, so the old KEK lived on beside the key database and a
key-store backup older than the rotation still unwrapped (the rotation period no longer
bounded backup residue, docs/governance.md).
"""

from __future__ import annotations

import base64
import json

from tests.conftest import Backend
from tests.kernel.conftest import consent
from tests.kernel.other_process import run_in_another_process
from uprof.kernel import Uprof


def files_holding(folder_text: dict[str, bytes], secret: bytes) -> list[str]:
    needles = (secret, base64.b64encode(secret))
    return sorted(name for name, data in folder_text.items() if any(n in data for n in needles))


def test_a_rotation_killed_while_it_writes_the_ring_leaves_no_old_kek_behind(
    backend: Backend, kernel: Uprof
) -> None:
    consent(kernel)  # a subject, so a data key is wrapped under the ring
    key_dir = kernel.settings.key_dir
    assert key_dir is not None
    ring = json.loads((key_dir / "keks.json").read_text())
    old_keys = [base64.b64decode(e["key"]) for e in ring["keks"]]

    died = run_in_another_process(
        backend,
        """
        real_replace = os.replace
        def dying(src, dst, *args, **kwargs):
            if str(dst).endswith("keks.json"):
                os._exit(9)
            return real_replace(src, dst, *args, **kwargs)
        os.replace = dying
        kernel.rotate_keys()
        """,
    )
    assert died.returncode == 9, died.stderr[-3000:]
    kernel.rotate_keys()  # the operator runs it again: it completes

    held = {p.name: p.read_bytes() for p in key_dir.iterdir() if p.is_file()}
    for old in old_keys:
        assert files_holding(held, old) == []
    assert kernel.stream_of("alice") is not None  # the subject's key still opens
    assert kernel.profile("alice") is not None
