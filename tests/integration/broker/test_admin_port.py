"""A broker with ``--admin-port``, a real process: operator calls on one port, SendMessages on the other.

The split exists for a NetworkPolicy, which admits traffic by port: so each port must refuse the
other's operations (with a ``WRONG_PORT`` fault that names the right port and changes nothing),
not merely also serve its own. Without ``--admin-port`` one port serves everything (every other
test in this folder).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import zeep

from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet, RunningProcess, free_port
from tests.integration.broker.conftest import reserve_address, start_relay
from tests.integration.broker.helpers import (
    fault_code,
    get_text,
    heartbeat,
    metric,
    post_bundle,
    raw_fault_code,
    soap_service,
)

pytestmark = pytest.mark.integration


def admin_view(broker: RunningProcess, admin_port: int) -> RunningProcess:
    """The same process, addressed at its admin port."""
    return dataclasses.replace(broker, port=admin_port)


def test_heartbeat_and_admin_calls_only_on_the_admin_port_send_messages_only_on_the_main_one(
    processes: ProcessSet, tmp_path: Path
) -> None:
    address = reserve_address()
    admin_port = free_port(address.host)
    relay = start_relay(processes, tmp_path, broker_args={"extra_args": ["--admin-port", str(admin_port)]})
    main, admin = relay.broker, admin_view(relay.broker, admin_port)

    # The operator's Heartbeat on the main port: refused, naming the admin port, nothing activated.
    with pytest.raises(zeep.exceptions.Fault) as refused:
        heartbeat(main, active=True, epoch=1)
    assert fault_code(refused.value) == "WRONG_PORT"
    assert f"admin port {admin_port}" in refused.value.message
    assert metric(main, "broker_active") == 0
    with pytest.raises(zeep.exceptions.Fault) as refused:
        soap_service(main).ListHeld()
    assert fault_code(refused.value) == "WRONG_PORT"

    # On the admin port it activates, and the admin operations answer.
    assert heartbeat(admin, active=True, epoch=1).state == "Active"
    assert not soap_service(admin).ListHeld()

    # SendMessages: accepted on the main port, refused on the admin port naming the main one.
    envelope = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "hello")])
    assert post_bundle(main.soap_url, envelope)[0] == 200
    status, body = post_bundle(
        admin.soap_url, build_envelope("acme", "1000", [("orders-0000", 2, "m-2", "x")])
    )
    assert (status, raw_fault_code(body)) == (500, "WRONG_PORT")
    assert f"main port {main.port}".encode() in body
    assert metric(main, "broker_messages_accepted_total") == 1

    # Probes stay on the main port; /metrics and the WSDL answer on both.
    assert get_text(main.url + "/readyz")[0] == 200
    assert get_text(admin.url + "/readyz")[0] == 404
    assert metric(admin, "broker_active") == 1
    assert get_text(admin.soap_url + "?wsdl")[0] == 200

    # SIGTERM still drains and exits 0 with two listeners.
    assert main.stop() == 0
