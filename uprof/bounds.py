"""Bounds of settings that a command line option shares with ``uprof.settings``.

Importable without the settings' model: the CLI builds its options (``max=``) when it
starts, and ``uprof --help`` need not load pydantic-settings (0249-cli-start-cost).
"""

from __future__ import annotations

#: The longest wait for the model endpoint's answer (``llm_timeout_s``), seconds.
LLM_TIMEOUT_MAX_S = 3600.0
