"""Where the operator's API client comes from (``__main__.load_api_client``), and that choosing says nothing.

In a pod, ``kubernetes.config.load_config`` printed "kube_config_path not provided ..." to stdout:
with the chart's ``logging.format: json`` that was the one line of the operator's log that was not
JSON (tests/e2e/test_chart_private_registry.py reads the log of the chart's operator pod).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import yaml

from broker_operator.__main__ import load_api_client


@pytest.fixture(autouse=True)
def default_configuration() -> Iterator[None]:
    """The client's process-wide default configuration, as it was before the test loaded one."""
    saved = kubernetes.client.Configuration.get_default_copy()
    yield
    kubernetes.client.Configuration.set_default(saved)


def test_in_a_pod_the_service_account_is_used_and_nothing_is_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kubernetes.config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))
    loaded: list[str] = []
    # The real loader reads the pod's fixed service-account paths; here it only records the call.
    monkeypatch.setattr(kubernetes.config, "load_incluster_config", lambda: loaded.append("in-cluster"))
    load_api_client()
    assert loaded == ["in-cluster"]
    assert capsys.readouterr() == ("", "")


def test_a_kubeconfig_wins_where_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "not-a-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setattr(kubernetes.config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.setattr(
        kubernetes.config, "load_incluster_config", lambda: pytest.fail("in-cluster with a kubeconfig")
    )
    client = load_api_client()
    assert client.configuration.host == "https://127.0.0.1:6443"
    assert capsys.readouterr() == ("", "")
