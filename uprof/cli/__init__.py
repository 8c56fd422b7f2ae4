"""The ``uprof`` command line (Typer + Rich)."""
