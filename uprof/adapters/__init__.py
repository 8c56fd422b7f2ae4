"""Adapters: concrete implementations of the ports in ``uprof.ports``."""
