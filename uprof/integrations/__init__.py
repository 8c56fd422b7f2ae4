"""Adapters for agent frameworks, each behind its own optional extra (pyproject.toml).

- ``uprof.integrations.langchain`` (``pip install 'uprof[langchain]'``): a retriever that
  returns a profile slice as ``Document``s, and a chat history that captures messages.
- ``uprof.integrations.openai_agents`` (``pip install 'uprof[openai-agents]'``): slice,
  capture and forget as OpenAI Agents SDK function tools.

They are built on the SDK (``uprof.sdk.Client``, over HTTP or embedded), so every call is
authenticated as an app and passes the same consent gate and policy as the REST API;
importing this package imports neither framework.
"""
