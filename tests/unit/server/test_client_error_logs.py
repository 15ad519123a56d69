"""vLLM's stream generators log a client's bad request with a traceback at ERROR; the service's filter makes it one
INFO line (service/server/openai_compat/client_error_logs.py), leaving real failures as they were."""

from __future__ import annotations

import logging

import pytest
from vllm.exceptions import VLLMValidationError

from service.server.openai_compat import client_error_logs


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def handler():
    parent = logging.getLogger("test_client_error_logs")
    parent.propagate = False
    records = Records()
    parent.addHandler(records)
    serving = logging.getLogger("test_client_error_logs.serving")
    assert client_error_logs.install("test_client_error_logs") == ["test_client_error_logs", serving.name]
    client_error_logs.install("test_client_error_logs")  # twice: one filter
    assert len(serving.filters) == 1
    yield records
    parent.removeHandler(records)


def test_it_is_installed_on_vllms_serving_loggers():
    import vllm.entrypoints.openai.chat_completion.serving  # noqa: F401

    assert "vllm.entrypoints.openai.chat_completion.serving" in client_error_logs.install()


def _log(error: Exception) -> None:
    try:
        raise error
    except Exception:
        logging.getLogger("test_client_error_logs.serving").exception("Error in %s stream generator.", "chat")


def test_a_client_error_is_one_info_line(handler):
    _log(VLLMValidationError("Requested sample logprobs of 21, which is greater than max allowed: 20"))
    (record,) = handler.records
    assert record.levelno == logging.INFO and record.exc_info is None
    assert record.getMessage() == (
        "Error in chat stream generator. A client error, the request is refused: Requested sample logprobs of 21, which is "
        "greater than max allowed: 20"
    )


def test_a_real_failure_keeps_its_level_and_traceback(handler):
    _log(RuntimeError("the engine broke"))
    (record,) = handler.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
