"""Token rotation on a real broker process under heartbeats (issue 13 item 5).

The broker's verifier files (the SHA-256 of each token: the broker holds no token) are replaced
the way a Secret volume is (a new file renamed over the path, so the path names a new inode)
while the operator's own heartbeat client keeps the active broker's lease renewed ten times a
second. Both orders are driven: the broker sees the
new token before the operator does, and the operator before the broker. Not one heartbeat may
fail, the broker stays Active at the same epoch, and the replaced token opens nothing once the
grace window (``--token-grace-seconds``) has passed.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from broker_contracts.soap import NAMESPACE, SOAP_ENV_NAMESPACE, BrokerState
from broker_contracts.token_verifier import token_verifier
from broker_operator.core import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import (
    BACKEND_TOKEN_VERIFIER_FILE,
    DEFAULT_BACKEND_TOKEN,
    DEFAULT_TOKEN,
    TOKEN_VERIFIER_FILE,
    ProcessSet,
    RunningProcess,
)
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import metric, post_raw, raw_fault_code

pytestmark = pytest.mark.integration

GRACE = 3.0
EPOCH = 4


def replace_file(path: Path, token: str) -> None:
    """``token``'s verifier written the way the kubelet's ``..data`` swap looks to a reader of
    ``path``: a new file, atomically."""
    staged = path.with_name(path.name + ".new")
    staged.write_text(token_verifier(token) + "\n")
    os.replace(staged, path)


def list_held(broker: RunningProcess, token: str) -> tuple[int, bytes]:
    """An admin call that changes nothing: the operator's credential opens it, nothing else does."""
    body = (
        f'<soap:Envelope xmlns:soap="{SOAP_ENV_NAMESPACE}" xmlns:t="{NAMESPACE}">'
        "<soap:Body><t:ListHeld/></soap:Body></soap:Envelope>"
    ).encode()
    return post_raw(broker.soap_url, body, token=token)


class Heartbeats:
    """The operator's heartbeat client renewing one broker's lease every 0.1 s; records every outcome."""

    def __init__(self, client: HeartbeatClient, target: BrokerTarget) -> None:
        self.client = client
        self.target = target
        self.failures: list[str] = []
        self.replies: list[tuple[BrokerState, int]] = []

    async def run(self) -> None:
        while True:
            try:
                reply = await asyncio.wait_for(self.client.heartbeat(self.target, True, EPOCH), 1.0)
            except (HeartbeatError, TimeoutError) as error:
                self.failures.append(str(error))
            else:
                self.replies.append((reply.state, reply.epoch))
            await asyncio.sleep(0.1)


def test_rotating_both_tokens_under_heartbeats_fails_no_heartbeat(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(
        processes, tmp_path, broker_args={"extra_args": ["--token-grace-seconds", str(GRACE)]}
    )
    broker = relay.broker
    token_file = tmp_path / "broker-0" / TOKEN_VERIFIER_FILE
    backend_token_file = tmp_path / "broker-0" / BACKEND_TOKEN_VERIFIER_FILE
    operator_secret = tmp_path / "operator-token"  # the operator's view of its Secret
    operator_secret.write_text(DEFAULT_TOKEN)
    target = BrokerTarget("broker-0", broker.soap_url, 0)

    async def scenario() -> Heartbeats:
        async def read_secret() -> str:
            return operator_secret.read_text().strip()

        client = HeartbeatClient(DEFAULT_TOKEN, "rotation-test", 1.0, refresh=read_secret)
        heartbeats = Heartbeats(client, target)
        task = asyncio.create_task(heartbeats.run())
        try:
            await asyncio.sleep(1.0)
            # 1. The broker sees the new token first; the operator is still on the old one for
            #    a while (its periodic Secret read has not come), within the grace window.
            replace_file(token_file, "rotated-1")
            await asyncio.sleep(1.5)
            assert client.token == DEFAULT_TOKEN
            client.update_token("rotated-1")
            await asyncio.sleep(GRACE + 0.5)
            # 2. The operator sees the next token first; the broker's file follows a second later.
            client.update_token("rotated-2")
            await asyncio.sleep(1.0)
            replace_file(token_file, "rotated-2")
            await asyncio.sleep(GRACE + 0.5)
            # 3. The broker sees a third token and drops the second after its grace, while the
            #    operator never calls update_token: a refused heartbeat makes it read the Secret.
            operator_secret.write_text("rotated-3")
            replace_file(token_file, "rotated-3")
            await asyncio.sleep(GRACE + 1.5)
            assert client.token == "rotated-3"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
        return heartbeats

    heartbeats = asyncio.run(scenario())

    assert heartbeats.failures == [], heartbeats.failures[:5]
    assert len(heartbeats.replies) > 50
    assert set(heartbeats.replies) == {(BrokerState.ACTIVE, EPOCH)}
    assert metric(broker, "broker_active") == 1
    # The replaced tokens open nothing after their grace window; the current one does.
    for old in (DEFAULT_TOKEN, "rotated-1", "rotated-2"):
        status, body = list_held(broker, old)
        assert (status, raw_fault_code(body)) == (500, "UNAUTHENTICATED"), old
    assert list_held(broker, "rotated-3")[0] == 200

    # The backend's credential follows its file the same way (SendMessages, its only operation).
    def send(seq: int, token: str) -> tuple[int, bytes]:
        return post_raw(broker.soap_url, build_envelope("acme", "1000", [("s1", seq, f"m{seq}", "p")]), token)

    replace_file(backend_token_file, "backend-rotated")
    assert send(1, "backend-rotated")[0] == 200
    assert send(2, DEFAULT_BACKEND_TOKEN)[0] == 200, "the previous one, within its grace"
    time.sleep(GRACE + 0.5)
    status, body = send(3, DEFAULT_BACKEND_TOKEN)
    assert (status, raw_fault_code(body)) == (500, "UNAUTHENTICATED")
