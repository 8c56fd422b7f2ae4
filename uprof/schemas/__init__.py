"""Pydantic wire models: what crosses the edge (JSONL, REST, MCP), validated strictly."""
