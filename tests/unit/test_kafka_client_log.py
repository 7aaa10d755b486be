"""What a tool's error says of librdkafka's last line: the text, without its origin prefix."""

from __future__ import annotations

import logging

from bridge.kafka_client_log import ClientLog


class _Client:
    def poll(self, timeout: float = 0, /) -> int:
        return 0


def test_the_last_warning_is_the_cause_without_its_origin() -> None:
    log = ClientLog()
    log.logger.log(
        logging.ERROR,
        "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: "
        "Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)",
    )
    log.logger.log(logging.INFO, "BGQUEUE [rdkafka#producer-1] [thrd:app]: Purging 1 events")
    assert log.cause(_Client()) == (
        " (librdkafka: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: "
        "Connection refused (after 0ms in state CONNECT))"
    )


def test_nothing_said_is_no_cause() -> None:
    assert ClientLog().cause(_Client()) == ""
