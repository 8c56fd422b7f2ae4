"""``uprof extractor check`` against the fake endpoint on loopback, and a dead port."""

from __future__ import annotations

import socket

from typer.testing import CliRunner

from tests.extraction.fake_openai import FakeOpenAI, Reply, chat_json
from uprof.cli.main import app

runner = CliRunner()

ANSWER = {
    "attributes": [{"key": "diet", "value": "vegetarian", "confidence": 0.9}],
    "memory": {"text": "I am vegetarian and I live in Porto.", "importance": 0.5},
}


def _check(base_url: str, *extra: str):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app, ["extractor", "check", "--base-url", base_url, "--model", "m1", *extra]
    )


def test_a_working_endpoint_answers_with_proposals(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(chat_json(ANSWER))
    result = _check(fake_llm.base_url)
    assert result.exit_code == 0, result.output
    assert "model m1: answered in" in result.output
    assert "AttributeProposal" in result.output and "MemoryProposal" in result.output
    [request] = fake_llm.requests  # exactly one call
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "m1"


def test_an_http_error_fails_with_the_reason(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(status=404, body='{"error": "model m1 not found"}'))
    result = _check(fake_llm.base_url)
    assert result.exit_code == 1
    assert "HTTP 404" in result.output
    assert "fix the base URL, model name or API key" in result.output


def test_a_dead_endpoint_fails_without_hanging() -> None:
    # Bound here and not listening: it refuses, and while it is held no other process
    # (a parallel test's server) can listen on it, as it could once closed.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        result = _check(f"http://127.0.0.1:{port}/v1", "--timeout-s", "2")
    assert result.exit_code == 1
    assert "could not reach model server" in result.output
    assert "retry later" in result.output


def test_a_bad_url_is_a_usage_error() -> None:
    result = _check("127.0.0.1:11434/v1")
    assert result.exit_code == 2
    assert "base_url must start with http://" in result.output
