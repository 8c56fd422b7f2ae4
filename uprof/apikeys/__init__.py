"""API keys: the credentials apps authenticate with, and their table.

Below the surfaces (REST, MCP, web, CLI) that check them and beside the kernel, so the
composition root (``uprof.bootstrap``) and the backup service reach them without
importing a surface (the layers contract in pyproject.toml). ``store`` holds the key
store, ``tables`` the ``api_keys`` table of the ``keys`` alembic branch.
"""
