"""Structured JSON logs, one object per line: time, level, logger, msg, and the context fields
(claim UID, claim, devices, ...) that callers pass with `extra=`."""

from __future__ import annotations

import json
import logging
import sys
import time

CONTEXT_FIELDS = ("driver", "node", "claim", "claimRef", "devices", "reason", "error", "durationMs", "slice",
                  "generation", "count", "path", "device", "healthy")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:
            if key in record.__dict__:
                out[key] = record.__dict__[key]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "info", driver: str = "", node: str = "") -> None:
    """Route all logging to stderr as JSON; every line carries the driver and node names."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())

    class _Context(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            record.__dict__.setdefault("driver", driver)
            record.__dict__.setdefault("node", node)
            return True

    handler.addFilter(_Context())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
