"""The logging configuration the servers hand to uvicorn.

uvicorn's default configuration is applied with ``dictConfig(...,
disable_existing_loggers=False)``, which re-enables every logger another library
had disabled. pycasbin disables its own loggers unless asked for logs, and logs
each denied request at WARNING; re-enabled, a single slice (deny by default over
every category the app may not read) would print a dozen lines. So the servers
pass this configuration instead: uvicorn's, plus casbin held at ERROR.

The access log keeps paths but never query strings: every uprof route takes its
identifiers in the body, and a caller that puts one in a query string (``?session_id=``)
must not see it written to the log (I9: no identifier in a log line).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from uvicorn.config import LOGGING_CONFIG

from uprof.logs import CASBIN_LOG_LEVEL


class DropQueryString(logging.Filter):
    """Cut the query string from uvicorn's access-log records (args: client, method,
    path with query, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path = args[2].split("?", 1)[0]
            record.args = (*args[:2], path, *args[3:])
        return True


def server_log_config(level: str = "info", log_format: str = "text") -> dict[str, Any]:
    """uvicorn's logging configuration with uprof's filters; ``log_format="json"``: every
    line, the access log's included, as one JSON object (``uprof.logs.JsonFormatter``)."""
    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["drop_query"] = {"()": DropQueryString}
    # On the logger, so every handler (ours or one an operator adds) gets the cut record.
    config["loggers"]["uvicorn.access"]["filters"] = ["drop_query"]
    config["loggers"]["casbin"] = {"level": CASBIN_LOG_LEVEL, "propagate": False, "handlers": []}
    config["loggers"]["uprof"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    if log_format == "json":
        for name in ("default", "access"):
            config["formatters"][name] = {"()": "uprof.logs.JsonFormatter"}
        # Libraries' warnings (eventsourcing, SQLAlchemy) reach the root logger, whose
        # fallback would print them as bare text in the middle of the JSON lines.
        config["root"] = {"handlers": ["default"], "level": "WARNING"}
    return config
