"""vLLM's stream generators log every exception with its traceback at ERROR ("Error in chat completion stream
generator."), a client's bad `logprobs` or `stop_token_ids` included: the service answers those 400, and an ERROR
with a traceback per bad request would page whoever watches the log. They become one INFO line naming the error;
the service's own failures keep their level and traceback."""

from __future__ import annotations

import logging

from vllm.exceptions import VLLMClientError


class ClientErrorsOnOneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, VLLMClientError):
            record.msg, record.args = f"{record.getMessage()} A client error, the request is refused: {exc}", None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def install(prefix: str = "vllm.entrypoints") -> list[str]:
    """On every logger under `prefix` that exists (call it once vLLM's serving modules are imported): a record
    meets the filters of the logger it is logged on, and vLLM logs on each module's own logger. Returns their names."""
    names = sorted(n for n in logging.root.manager.loggerDict if n == prefix or n.startswith(prefix + "."))
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ClientErrorsOnOneLine) for f in logger.filters):
            logger.addFilter(ClientErrorsOnOneLine())
    return names
