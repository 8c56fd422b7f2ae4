"""Pure domain of uprof: aggregates, events, value objects and errors.

Nothing here performs I/O, reads the clock or imports a framework other than
``eventsourcing.domain``.
"""
