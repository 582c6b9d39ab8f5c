"""The operator's settings: flags win over environment variables, bad values are refused by name."""

from __future__ import annotations

import pytest

from broker_operator.controller.settings import ControllerSettings, parse_settings


def test_environment_then_flags() -> None:
    environ = {"OPERATOR_NAMESPACES": "erp, crm", "OPERATOR_METRICS_PORT": "9100", "OPERATOR_ID": "op-a"}
    from_env = parse_settings([], environ)
    assert from_env.namespaces == ("erp", "crm")
    assert (from_env.metrics_port, from_env.operator_id) == (9100, "op-a")
    from_flags = parse_settings(
        ["--namespace", "sales", "--metrics-port", "0", "--operator-id", "op-b"], environ
    )
    assert from_flags.namespaces == ("sales",)
    assert (from_flags.metrics_port, from_flags.operator_id) == (0, "op-b")


def test_defaults_watch_everything_standalone() -> None:
    settings = parse_settings([], {})
    assert settings.namespaces == ()
    assert settings.peering is None
    assert settings.reconcile_seconds == ControllerSettings().reconcile_seconds


def test_the_token_recheck_interval_is_a_setting() -> None:
    assert parse_settings([], {}).token_recheck_seconds == 30
    assert parse_settings([], {"OPERATOR_TOKEN_RECHECK_SECONDS": "2"}).token_recheck_seconds == 2
    assert parse_settings(["--token-recheck-seconds", "5"], {}).token_recheck_seconds == 5


def test_token_rereads_are_spread_over_the_clusters_within_a_budget() -> None:
    settings = parse_settings([], {})
    assert settings.token_reads_per_second == 10
    assert parse_settings([], {"OPERATOR_TOKEN_READS_PER_SECOND": "4"}).token_reads_per_second == 4
    # Few clusters: each reads every token_recheck_seconds; many: the operator's reads stay at 10/s.
    assert settings.token_recheck_for(20) == 30
    assert settings.token_recheck_for(300) == 30
    assert settings.token_recheck_for(2000) == 200
    assert parse_settings(["--token-reads-per-second", "40"], {}).token_recheck_for(2000) == 50


@pytest.mark.parametrize(
    "argv",
    [
        ["--metrics-port", "70000"],
        ["--reconcile-seconds", "0"],
        ["--token-recheck-seconds", "0"],
        ["--token-reads-per-second", "0"],
    ],
)
def test_bad_values_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(argv, {})
    assert argv[0] in capsys.readouterr().err


def test_the_operators_pod_identity_for_network_policies() -> None:
    # The chart passes both through the environment (downward API for the namespace).
    env = {"OPERATOR_POD_NAMESPACE": "broker-system", "OPERATOR_POD_LABELS": "b=2, a=1,,"}
    settings = parse_settings([], env)
    assert (settings.pod_namespace, settings.pod_labels) == ("broker-system", (("a", "1"), ("b", "2")))
    assert parse_settings(["--pod-namespace", "ops", "--pod-labels", "x=y"], env).pod_labels == (("x", "y"),)
    assert (ControllerSettings().pod_namespace, ControllerSettings().pod_labels) == (None, ())


def test_a_pod_label_without_a_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--pod-labels", "app"], {})
    assert "'app' is not key=value" in capsys.readouterr().err


def test_brokers_serve_tls_by_default_and_the_flag_or_environment_turns_it_off() -> None:
    # ARCHITECTURE.md "Channels and trust": TLS is the default path, plain HTTP the opt-out.
    assert ControllerSettings().broker_tls is True
    assert parse_settings([], {}).broker_tls is True
    assert parse_settings(["--no-broker-tls"], {}).broker_tls is False
    # The chart's operator.brokerTls, quoted into the environment as "true" / "false".
    assert parse_settings([], {"OPERATOR_BROKER_TLS": "false"}).broker_tls is False
    assert parse_settings([], {"OPERATOR_BROKER_TLS": " True "}).broker_tls is True
    assert parse_settings(["--broker-tls"], {"OPERATOR_BROKER_TLS": "false"}).broker_tls is True  # flag wins


def test_a_broker_tls_environment_value_that_is_not_a_boolean_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_settings([], {"OPERATOR_BROKER_TLS": "sometimes"})
    assert "OPERATOR_BROKER_TLS ('sometimes') must be true or false" in capsys.readouterr().err


def test_the_broker_image_and_its_pull_secrets_are_settings_for_every_cluster() -> None:
    # The chart's brokerImage and imagePullSecrets (issue 42): one registry for every BrokerCluster.
    default = parse_settings([], {})
    assert default.broker_image == "localhost/broker-failover/broker:0.1.0"  # the CRD's former default
    assert default.broker_image_pull_secrets == ()
    env = {
        "OPERATOR_BROKER_IMAGE": "registry.example.com/broker-failover/broker:0.1.0",
        "OPERATOR_BROKER_IMAGE_PULL_SECRETS": "regcred, mirror.pull,,regcred",
    }
    settings = parse_settings([], env)
    assert settings.broker_image == "registry.example.com/broker-failover/broker:0.1.0"
    assert settings.broker_image_pull_secrets == ("regcred", "mirror.pull")  # in order, each once
    assert settings.pod_defaults.image == settings.broker_image
    flags = ["--broker-image", "mirror.example.com/broker:1", "--broker-image-pull-secrets", "other"]
    from_flags = parse_settings(flags, env)
    assert (from_flags.broker_image, from_flags.broker_image_pull_secrets) == (
        "mirror.example.com/broker:1",
        ("other",),
    )
    # Set but empty (a chart value left blank): the default image, no pull secrets.
    blank = parse_settings([], {"OPERATOR_BROKER_IMAGE": " ", "OPERATOR_BROKER_IMAGE_PULL_SECRETS": ""})
    assert (blank.broker_image, blank.broker_image_pull_secrets) == (default.broker_image, ())


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"OPERATOR_BROKER_IMAGE_PULL_SECRETS": "regcred,Reg_Cred"},
            "OPERATOR_BROKER_IMAGE_PULL_SECRETS: 'Reg_Cred' is not a Secret name",
        ),
        ({"OPERATOR_BROKER_IMAGE": "a b"}, "--broker-image / OPERATOR_BROKER_IMAGE ('a b') must be an image"),
    ],
)
def test_a_broker_image_setting_that_cannot_work_is_refused(
    environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_settings([], environ)
    assert message in capsys.readouterr().err
