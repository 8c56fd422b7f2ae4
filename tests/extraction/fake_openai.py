"""A fake OpenAI-compatible chat server on loopback, for testing the LLM extractor.

It runs the standard library's HTTP server in a thread on 127.0.0.1 and a free
port. Each test scripts the replies it wants (status, body, delay) and reads
back the requests the extractor sent.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer: HTTP status, raw body, and how long to stall first."""

    status: int = 200
    body: str = ""
    delay_s: float = 0.0
    content_type: str = "application/json"


@dataclass(frozen=True)
class Request:
    """One request the fake server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def chat(content: str) -> Reply:
    """A 200 chat-completions answer whose assistant message is content."""
    envelope = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    return Reply(body=json.dumps(envelope))


def chat_json(obj: Any) -> Reply:
    """A chat answer whose content is obj serialised as JSON."""
    return chat(json.dumps(obj))


@dataclass
class FakeOpenAI:
    """The server's state: scripted replies in, received requests out."""

    replies: deque[Reply] = field(default_factory=deque)
    requests: list[Request] = field(default_factory=list)
    #: Set at shutdown so a stalled handler stops waiting at once.
    release: threading.Event = field(default_factory=threading.Event)
    base_url: str = ""

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)


class _Server(ThreadingHTTPServer):
    # Join handler threads on close, so no thread outlives its test.
    daemon_threads = False
    block_on_close = True
    state: FakeOpenAI


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        state.requests.append(Request(self.path, dict(self.headers.items()), body))
        reply = (
            state.replies.popleft()
            if state.replies
            else Reply(status=500, body="no reply scripted")
        )
        if reply.delay_s and state.release.wait(reply.delay_s):
            return  # the test is over; the client has gone
        payload = reply.body.encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client timed out and closed the connection

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""


class running_fake_openai:
    """Context manager: start the fake server on 127.0.0.1 and a free port."""

    def __enter__(self) -> FakeOpenAI:
        self.state = FakeOpenAI()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.state = self.state
        host, port = self.server.server_address[:2]
        self.state.base_url = f"http://{host}:{port}/v1"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()
        return self.state

    def __exit__(self, *exc: object) -> None:
        self.state.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
