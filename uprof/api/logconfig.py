"""The logging configuration the servers hand to uvicorn.

uvicorn's default configuration is applied with ``dictConfig(...,
disable_existing_loggers=False)``, which re-enables every logger another library
had disabled. pycasbin disables its own loggers unless asked for logs, and logs
each denied request at WARNING; re-enabled, a single slice (deny by default over
every category the app may not read) would print a dozen lines. So the servers
pass this configuration instead: uvicorn's, plus casbin held at ERROR.
"""

from __future__ import annotations

import copy
from typing import Any

from uvicorn.config import LOGGING_CONFIG


def server_log_config(level: str = "info") -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["casbin"] = {"level": "ERROR", "propagate": False, "handlers": []}
    config["loggers"]["uprof"] = {"handlers": ["default"], "level": level.upper(),
                                  "propagate": False}
    return config
