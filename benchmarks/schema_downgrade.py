"""A deployment's stores taken down to an earlier schema revision: the store of an
operator who installed this release over the previous one and has not started it yet.

One place for the upgrade benchmark (benchmarks/upgrade_start_bench.py) and the upgrade
tests (tests/kernel/test_upgrade_processes.py, tests/kernel/test_review_of_0149.py) to
make that store: alembic's own downgrade, each branch in the store that holds it.
"""

from __future__ import annotations

from uprof.backends import StorageLayout
from uprof.storage import create_engine, downgrade_to

#: One revision below each branch's head: the previous release's schema.
PREVIOUS = {"views": "0007_views_signed_out_sessions", "keys": "0005_keys_plain_row_keys"}


def downgrade_stores(layout: StorageLayout, to: dict[str, str]) -> None:
    """Take the views store to ``to["views"]`` and the key store to ``to["keys"]``."""
    for branch, url in (("views", layout.views_url), ("keys", layout.keys_url)):
        engine = create_engine(url)
        try:
            downgrade_to(engine, branch, to[branch])
        finally:
            engine.dispose()
