"""Broker pods log as the operator does, and the setting never replaces a pod (issue 42)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker_contracts import environment
from broker_contracts.logs import LogFormat, LogSettings
from broker_contracts.token_verifier import token_verifier
from broker_operator.controller import builders, names
from broker_operator.controller.spec import parse_spec
from broker_service import settings as broker_settings

OWNER: dict[str, Any] = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
}
SPEC = parse_spec("orders", {"account": "acme", "company": "1000"})


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("log", [LogSettings(), LogSettings(LogFormat.JSON, "DEBUG")])
def test_the_broker_reads_the_operators_format_and_level_from_its_pod(
    tmp_path: Path, log: LogSettings
) -> None:
    env = env_of(builders.build_pod(OWNER, 0, SPEC, active=False, log=log))
    assert env[environment.BROKER_FAILOVER_LOG_FORMAT] == log.format.value
    assert env[environment.BROKER_FAILOVER_LOG_LEVEL] == log.level
    (tmp_path / "token").write_text(token_verifier("operator"))
    (tmp_path / "backend").write_text(token_verifier("backend"))
    read = broker_settings.parse_settings(
        [],
        {
            environment.BROKER_DATA_DIR: str(tmp_path),
            environment.BROKER_TOKEN_VERIFIER_FILE: str(tmp_path / "token"),
            environment.BROKER_BACKEND_TOKEN_VERIFIER_FILE: str(tmp_path / "backend"),
            environment.BROKER_FAILOVER_LOG_FORMAT: env[environment.BROKER_FAILOVER_LOG_FORMAT],
            environment.BROKER_FAILOVER_LOG_LEVEL: env[environment.BROKER_FAILOVER_LOG_LEVEL],
        },
    )
    assert read.log == log


def test_a_change_of_the_log_setting_keeps_every_pods_template_hash() -> None:
    # An operator upgrade that first sets the variables, or a change of the chart's logging, must
    # not roll every broker of every cluster (a switchover each): the hash is the one the spec made.
    key = names.ANNOTATION_TEMPLATE_HASH
    hashes = {
        builders.build_pod(OWNER, 0, SPEC, active=False, log=log)["metadata"]["annotations"][key]
        for log in (
            LogSettings(),
            LogSettings(LogFormat.JSON, "WARNING"),
            LogSettings(LogFormat.TEXT, "DEBUG"),
        )
    }
    assert hashes == {builders.template_hash("orders", SPEC)}
    # ...which is the hash of a container without the two variables, as before issue 42.
    assert not {
        environment.BROKER_FAILOVER_LOG_FORMAT,
        environment.BROKER_FAILOVER_LOG_LEVEL,
    } & {e["name"] for e in builders.broker_container("orders", SPEC)["env"]}


def test_a_broker_settings_error_names_a_wrong_log_value(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(token_verifier("operator"))
    (tmp_path / "backend").write_text(token_verifier("backend"))
    with pytest.raises(
        broker_settings.SettingsError, match="--log-level / BROKER_FAILOVER_LOG_LEVEL = 'TRACE'"
    ):
        broker_settings.parse_settings(
            [
                "--data-dir",
                str(tmp_path),
                "--token-verifier-file",
                str(tmp_path / "token"),
                "--backend-token-verifier-file",
                str(tmp_path / "backend"),
                "--log-level",
                "TRACE",
            ],
            {},
        )
