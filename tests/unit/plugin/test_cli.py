"""The command line: arguments, kubeconfig flags, exit codes and the error lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from broker_operator.kubectl_plugin import cli, kube
from broker_operator.kubectl_plugin.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PluginError, UsageError
from tests.unit.plugin.support import FakeKube, cluster_body


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    fake = FakeKube(cluster_body())
    monkeypatch.setattr(cli, "connect", lambda *args: fake)
    return fake


def test_flags_go_before_or_after_the_subcommand() -> None:
    parser = cli.build_parser()
    after = parser.parse_args(["status", "orders", "-n", "shop", "--context", "c1", "-o", "json"])
    before = parser.parse_args(["-n", "shop", "--context", "c1", "-o", "json", "status", "orders"])
    for args in (after, before):
        assert (args.command, args.cluster, args.namespace, args.context, args.output) == (
            "status", "orders", "shop", "c1", "json",
        )  # fmt: skip
    held = parser.parse_args(
        ["held", "replay", "orders", "inbound", "invoices-0000", "3", "--broker", "orders-1"]
    )
    assert (held.action, held.direction, held.stream, held.seq, held.broker) == (
        "replay", "inbound", "invoices-0000", 3, "orders-1",
    )  # fmt: skip
    move = parser.parse_args(["switchover", "orders", "orders-1", "--timeout", "90s", "--wait=false"])
    assert (move.timeout, move.wait) == (90.0, False)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["switchover", "orders"],
        ["held", "replay", "orders", "sideways", "s", "1"],
        ["held", "replay", "orders", "inbound", "s", "one"],
        ["switchover", "orders", "orders-1", "--timeout", "-3"],
        ["status", "-o", "yaml"],
    ],
)
def test_bad_usage_exits_2_with_an_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == EXIT_USAGE
    assert "error:" in capsys.readouterr().err


def test_status_json_for_scripts(fake: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "orders", "-o", "json", "--no-held"]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert (document["schema"], document["active"], document["epoch"]) == (
        "kubectl-broker/status/v1",
        "orders-0",
        3,
    )


def test_errors_are_one_line_on_stderr_with_their_exit_code(
    fake: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "nosuch"]) == EXIT_USAGE
    assert capsys.readouterr().err == "error: BrokerCluster 'nosuch' not found in namespace shop\n"
    assert cli.main(["switchover", "orders", "orders-5"]) == EXIT_USAGE
    assert "broker 'orders-5' is not in BrokerCluster orders" in capsys.readouterr().err
    assert cli.main(["status", "orders", "-A"]) == EXIT_USAGE


def test_report_show_that_cannot_read_fails_with_advice(
    fake: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.body["status"]["ordering"] = {
        "lastCheckTime": "2026-11-23T11:45:00Z", "result": "Passed", "violations": 0,
        "report": "pvc/logs/.validator/reports/report.html",
    }  # fmt: skip
    assert cli.main(["report", "orders"]) == EXIT_OK
    assert "Result:       Passed" in capsys.readouterr().out
    assert cli.main(["report", "orders", "--show"]) == EXIT_FAILED
    assert "kubectl cp" in capsys.readouterr().err


def write_kubeconfig(path: Path, namespace: str | None) -> Path:
    context: dict[str, Any] = {"cluster": "local", "user": "admin"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "main",
        "clusters": [{"name": "local", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "admin", "user": {"token": "t"}}],
        "contexts": [
            {"name": "main", "context": context},
            {"name": "other", "context": {**context, "namespace": "ops"}},
        ],
    }))  # fmt: skip
    return path


def test_the_namespace_comes_from_the_flag_then_the_context_then_default(tmp_path: Path) -> None:
    config = str(write_kubeconfig(tmp_path / "config", "shop"))
    assert kube.connect(config, None, None).namespace == "shop"
    assert kube.connect(config, "other", None).namespace == "ops"
    assert kube.connect(config, None, "explicit").namespace == "explicit"
    bare = str(write_kubeconfig(tmp_path / "bare", None))
    assert kube.connect(bare, None, None).namespace == "default"


def test_kubeconfig_problems_are_usage_errors(tmp_path: Path) -> None:
    config = str(write_kubeconfig(tmp_path / "config", "shop"))
    with pytest.raises(
        UsageError, match=r"context 'nope' is not in the kubeconfig \(contexts: main, other\)"
    ):
        kube.connect(config, "nope", None)
    with pytest.raises(UsageError, match="cannot read the kubeconfig"):
        kube.connect(str(tmp_path / "missing"), None, None)


def refusing(status: int, message: str) -> Any:
    def method(*args: Any, **kwargs: Any) -> Any:
        error = ApiException(status=status, reason="Refused")
        error.body = json.dumps({"message": message})
        raise error

    return method


def test_api_refusals_name_the_verb_and_resource() -> None:
    with pytest.raises(PluginError) as forbidden:
        kube._call(
            "patch", "brokerclusters.broker.failover.dev", "shop", refusing(403, "user alice cannot patch")
        )
    assert forbidden.value.exit_code == EXIT_FAILED
    assert str(forbidden.value) == (
        "forbidden: you may not patch brokerclusters.broker.failover.dev in namespace shop "
        "(user alice cannot patch); ask for a Role that grants it (check with: kubectl auth can-i patch "
        "brokerclusters.broker.failover.dev -n shop)"
    )
    with pytest.raises(UsageError, match="BrokerCluster 'gone' not found in namespace shop"):
        kube._call("get", "brokerclusters", "shop", refusing(404, "not found"), missing="gone")
    with pytest.raises(PluginError, match="cannot get secrets in namespace shop: HTTP 500: boom"):
        kube._call("get", "secrets", "shop", refusing(500, "boom"))
