"""Short CI versions of the reliability scenarios in benchmarks/reliability.py.

The long versions (50 SIGKILLs per backend, 100k slices, a 10-minute soak) run from
``python -m benchmarks.reliability``; see docs/reliability.md.
"""

from __future__ import annotations

import pytest

from benchmarks.reliability import Target
from tests.conftest import Backend


@pytest.fixture
def target(backend: Backend) -> Target:
    return Target(
        backend.kind,
        backend.data_dir / "data",
        backend.url if backend.kind == "postgres" else None,
    )
