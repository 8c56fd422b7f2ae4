"""Read models built from the event log. Each subpackage: tables, projector, queries."""
