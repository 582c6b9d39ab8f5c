"""The operator's own settings, as one typed object read once from flags and environment.

Every flag also reads an environment variable (the flag wins), like the
broker's CLI, so that the Helm chart can set them either way. The object is
built in ``__main__`` and handed to the kopf handlers through kopf's memo;
nothing below this module reads the environment.

Per-cluster behaviour (heartbeat intervals, failback, ...) is not here: it is
in each BrokerCluster's spec.
"""

from __future__ import annotations

import argparse
import random
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker_contracts.logs import DEFAULT_LOG_SETTINGS, LogSettings, add_log_arguments, log_settings_from
from broker_operator.controller.endpoint_hosts import EndpointHosts
from broker_operator.controller.pod_fields import DEFAULT_BROKER_IMAGE, PodDefaults
from broker_operator.controller.pod_security import POD_SECURITY_LEVELS, BrokerImages
from broker_operator.controller.pod_spec import DNS_SUBDOMAIN, NAME_MAX
from broker_operator.controller.sharding import Shard


@dataclass(frozen=True)
class ControllerSettings:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    operator_id: str = "broker-operator"  # sent in every Heartbeat; names this operator in broker logs
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9090  # 0: no metrics server
    liveness_endpoint: str | None = None  # kopf's health endpoint, e.g. http://0.0.0.0:8081/healthz
    peering: str | None = None  # kopf peering name; None = standalone. Not a fence (see epochs.py).
    # kopf peering priority; the highest alive handles every cluster, the others stand by. None:
    # derived from the start time (peering_priority_from), so the longest-running replica keeps
    # handling and a restarted one stands by. Equal priorities make kopf pause *every* replica.
    peering_priority: int | None = None
    # How long a replica's peering record counts as alive without a keep-alive: a replica killed
    # with -9 is taken over by the next one this long after its last keep-alive, at most.
    peering_lifetime_seconds: int = 60
    reconcile_seconds: float = 10.0  # how often children are re-checked even without events
    # A new cluster's engine waits this long for every broker pod to be Ready before it starts
    # with those that have an IP (see daemon.may_start).
    startup_grace_seconds: float = 30.0
    # How long a stopped engine's last status write and events may still take (ClusterLoop.run): a
    # drain evicting the handling replica mid-switchover otherwise lost the switchover's status
    # and its event.
    status_grace_seconds: float = 3.0
    daemon_poll_seconds: float = 1.0  # how often a waiting daemon re-checks (token, pod IPs, conflict)
    # How often a running cluster's token Secret is read again, so a rotated token reaches the
    # heartbeats without a restart (a broker refusing every token known also triggers a read).
    token_recheck_seconds: float = 30.0
    # At most this many of those re-reads per second over every running cluster: with many
    # clusters each one's comes less often (2,000 clusters: every 200 s), so the reads stay a
    # small, fixed load on the API server and the operator (at 30 s each, N/30 a second were a
    # sixth of the operator's CPU at 1,000 clusters). A broker refusing every token known still
    # makes its cluster read the Secret at once.
    token_reads_per_second: float = 10.0
    # Who the operator is, for the NetworkPolicy of a cluster with spec.networkPolicy.enabled: its
    # pods' namespace and labels (the chart sets both). The policy admits the admin port from pods
    # with these labels in this namespace; without a namespace no policy is made (an operator run
    # outside the cluster has no pod a policy could name).
    pod_namespace: str | None = None
    pod_labels: tuple[tuple[str, str], ...] = ()
    # This process drives only the BrokerClusters of its shard (sharding.py); None: all of them.
    shard: Shard | None = None
    # The hosts spec.endpoints[].url may name (endpoint_hosts.py); None: any (a bare operator; the
    # chart always sets a list, empty by default: no endpoints-mode cluster until the installer
    # names where its brokers live).
    endpoint_hosts: EndpointHosts | None = None
    # Broker pods: "restricted" refuses a spec whose securityContexts break the restricted Pod
    # Security Standard, "unchecked" leaves that to Pod Security admission; images: fnmatch
    # patterns spec.image must match (empty: any). See pod_security.py.
    broker_pod_security: str = "restricted"
    broker_images: BrokerImages = field(default_factory=BrokerImages)
    # The broker image of every BrokerCluster without spec.image (the chart's brokerImage, so that one
    # value points every cluster at the user's registry), and the Secrets every broker pod pulls
    # with, before the cluster's own spec.imagePullSecrets (pod_fields.py). A changed image rolls the
    # clusters that follow it (the template hash), one pod at a time, standbys first; changed pull
    # secrets reach the pods made from then on only (a running pod pulls nothing).
    broker_image: str = DEFAULT_BROKER_IMAGE
    broker_image_pull_secrets: tuple[str, ...] = ()
    # Whether broker pods serve TLS as spec.tls asks (the certificates mounted, BROKER_TLS_DIR, HTTPS
    # probes; builders.serves_tls), and so whether the operator heartbeats them over mutual TLS
    # (heartbeat_tls.py). On by default (ARCHITECTURE.md "Channels and trust"); --no-broker-tls /
    # OPERATOR_BROKER_TLS=false (the chart's operator.brokerTls) is the install-wide opt-out, which
    # leaves every spec.tls accepted and its certificates reported but the pods on plain HTTP.
    # Changing it rolls each cluster's pods once (the template hash), one at a time, standbys first.
    broker_tls: bool = True
    # How often a cluster's certificate Secrets are read again while nothing is due (certificates.py):
    # a Secret deleted or replaced by hand, or renewed by cert-manager (mode Secrets), is seen within
    # it. A renewal, a warning or an expiry falling due is checked at its time whatever this says.
    certificates_recheck_seconds: float = 60.0
    # Log format and level, for the operator's lines and kopf's (kopf_logging.py), and passed to
    # the broker pods it makes (builders.with_log_environment).
    log: LogSettings = DEFAULT_LOG_SETTINGS

    @property
    def pod_defaults(self) -> PodDefaults:
        """What these settings give every broker pod (the builders' ``defaults``)."""
        return PodDefaults(self.broker_image, self.broker_image_pull_secrets)

    def token_recheck_for(self, running: int) -> float:
        """Seconds between a cluster's periodic token re-reads while ``running`` clusters run."""
        return max(self.token_recheck_seconds, running / self.token_reads_per_second)

    def drives(self, namespace: str, name: str) -> bool:
        """Whether this operator process drives the BrokerCluster ``namespace/name``."""
        return self.shard is None or self.shard.drives(namespace, name)


def parse_pod_labels(text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` (the chart's OPERATOR_POD_LABELS) as sorted pairs; raises ValueError naming a bad one."""
    pairs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--pod-labels / OPERATOR_POD_LABELS: {item!r} is not key=value")
        pairs.append((key.strip(), value.strip()))
    return tuple(sorted(pairs))


def parse_pull_secrets(text: str) -> tuple[str, ...]:
    """``a,b`` (OPERATOR_BROKER_IMAGE_PULL_SECRETS) as names, in order, each once; raises ValueError
    naming one that cannot be a Secret's name."""
    names = [item.strip() for item in text.split(",") if item.strip()]
    for name in names:
        if len(name) > NAME_MAX or not DNS_SUBDOMAIN.match(name):
            raise ValueError(
                f"--broker-image-pull-secrets / OPERATOR_BROKER_IMAGE_PULL_SECRETS: {name!r} is not a "
                "Secret name (lower-case letters, digits, '-' and '.')"
            )
    return tuple(dict.fromkeys(names))


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(text: str, name: str, parser: argparse.ArgumentParser) -> bool:
    """A boolean environment variable (true/false, 1/0, yes/no, on/off); anything else is refused."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    parser.error(f"{name} ({text!r}) must be true or false")


def parse_settings(argv: Sequence[str] | None, environ: Mapping[str, str]) -> ControllerSettings:
    """Settings from ``argv`` and ``environ``; a flag wins over its environment variable."""

    def env(name: str, default: str) -> str:
        return environ.get(name, default)

    parser = argparse.ArgumentParser(
        prog="broker-operator",
        description="Runs BrokerClusters: broker pods, heartbeats, failover (kopf).",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=None,
        help="watch this namespace (repeatable); env OPERATOR_NAMESPACES, comma-separated; default: all",
    )
    parser.add_argument("--operator-id", default=env("OPERATOR_ID", socket.gethostname()))
    parser.add_argument("--metrics-host", default=env("OPERATOR_METRICS_HOST", "0.0.0.0"))
    parser.add_argument("--metrics-port", type=int, default=int(env("OPERATOR_METRICS_PORT", "9090")))
    parser.add_argument("--liveness", default=env("OPERATOR_LIVENESS_ENDPOINT", "") or None)
    parser.add_argument("--peering", default=env("OPERATOR_PEERING", "") or None)
    parser.add_argument(
        "--peering-priority",
        type=int,
        default=int(env("OPERATOR_PEERING_PRIORITY", "")) if env("OPERATOR_PEERING_PRIORITY", "") else None,
        help="kopf peering priority (highest alive handles); default: older start = higher",
    )
    parser.add_argument(
        "--peering-lifetime-seconds",
        type=int,
        default=int(env("OPERATOR_PEERING_LIFETIME_SECONDS", "60")),
        help="a peer silent this long counts as dead and the next replica takes over",
    )
    parser.add_argument(
        "--reconcile-seconds", type=float, default=float(env("OPERATOR_RECONCILE_SECONDS", "10"))
    )
    parser.add_argument(
        "--startup-grace-seconds",
        type=float,
        default=float(env("OPERATOR_STARTUP_GRACE_SECONDS", "30")),
        help="how long a new cluster waits for every broker pod to be Ready before heartbeats start",
    )
    parser.add_argument(
        "--token-recheck-seconds",
        type=float,
        default=float(env("OPERATOR_TOKEN_RECHECK_SECONDS", "30")),
        help="how often each cluster's operator-token Secret is read again (rotation without restart)",
    )
    parser.add_argument(
        "--token-reads-per-second",
        type=float,
        default=float(env("OPERATOR_TOKEN_READS_PER_SECOND", "10")),
        help="at most this many token re-reads a second over all clusters (with many, each one less often)",
    )
    parser.add_argument(
        "--pod-namespace",
        default=env("OPERATOR_POD_NAMESPACE", "") or None,
        help="the operator pods' namespace, which NetworkPolicies admit (env OPERATOR_POD_NAMESPACE)",
    )
    parser.add_argument(
        "--pod-labels",
        default=env("OPERATOR_POD_LABELS", ""),
        help="the operator pods' labels as k=v,k=v, which NetworkPolicies admit (env OPERATOR_POD_LABELS)",
    )
    parser.add_argument(
        "--shard",
        default=env("OPERATOR_SHARD", ""),
        help="INDEX/COUNT: drive only the BrokerClusters of this shard (env OPERATOR_SHARD); default: all",
    )
    parser.add_argument(
        "--endpoint-hosts",
        default=environ.get("OPERATOR_ENDPOINT_HOSTS"),
        help="comma-separated host patterns (*.erp.example.com) and networks (10.0.0.0/8) that "
        "spec.endpoints[].url may name; '*': any; set but empty: none (env OPERATOR_ENDPOINT_HOSTS); "
        "default: any",
    )
    parser.add_argument(
        "--broker-pod-security",
        choices=POD_SECURITY_LEVELS,
        default=env("OPERATOR_BROKER_POD_SECURITY", "restricted"),
        help="restricted: refuse broker securityContexts the restricted Pod Security Standard forbids "
        "(env OPERATOR_BROKER_POD_SECURITY)",
    )
    parser.add_argument(
        "--broker-images",
        default=env("OPERATOR_BROKER_IMAGES", ""),
        help="comma-separated fnmatch patterns spec.image must match; empty: any "
        "(env OPERATOR_BROKER_IMAGES)",
    )
    _add_broker_pod_arguments(parser, environ)
    parser.add_argument(
        "--certificates-recheck-seconds",
        type=float,
        default=float(env("OPERATOR_CERTIFICATES_RECHECK_SECONDS", "60")),
        help="how often each cluster's certificate Secrets are read again while nothing is due "
        "(env OPERATOR_CERTIFICATES_RECHECK_SECONDS)",
    )
    add_log_arguments(parser)
    args = parser.parse_args(argv)
    try:
        endpoint_hosts = (
            None if args.endpoint_hosts is None else EndpointHosts.parse(args.endpoint_hosts.split(","))
        )
    except ValueError as error:
        parser.error(f"--endpoint-hosts / OPERATOR_ENDPOINT_HOSTS: {error}")
    try:
        pod_labels = parse_pod_labels(args.pod_labels)
    except ValueError as error:
        parser.error(str(error))
    try:
        shard = Shard.parse(args.shard) if args.shard.strip() else None
    except ValueError as error:
        parser.error(f"--shard / OPERATOR_SHARD: {error}")
    namespaces = args.namespace or [ns for ns in env("OPERATOR_NAMESPACES", "").split(",") if ns.strip()]
    if args.metrics_port < 0 or args.metrics_port > 65535:
        parser.error(f"--metrics-port ({args.metrics_port}) must be 0..65535 (0 = no metrics server)")
    if args.reconcile_seconds <= 0:
        parser.error(f"--reconcile-seconds ({args.reconcile_seconds}) must be positive")
    if args.peering_lifetime_seconds < 10:
        # kopf sends a keep-alive 5-10 s before the record expires (at least every second).
        parser.error(f"--peering-lifetime-seconds ({args.peering_lifetime_seconds}) must be at least 10")
    if args.token_recheck_seconds <= 0:
        parser.error(f"--token-recheck-seconds ({args.token_recheck_seconds}) must be positive")
    if args.certificates_recheck_seconds <= 0:
        parser.error(f"--certificates-recheck-seconds ({args.certificates_recheck_seconds}) must be positive")
    if args.token_reads_per_second <= 0:
        parser.error(f"--token-reads-per-second ({args.token_reads_per_second}) must be positive")
    return ControllerSettings(
        namespaces=tuple(ns.strip() for ns in namespaces),
        operator_id=args.operator_id,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        liveness_endpoint=args.liveness,
        peering=args.peering,
        peering_priority=args.peering_priority,
        peering_lifetime_seconds=args.peering_lifetime_seconds,
        reconcile_seconds=args.reconcile_seconds,
        startup_grace_seconds=args.startup_grace_seconds,
        token_recheck_seconds=args.token_recheck_seconds,
        token_reads_per_second=args.token_reads_per_second,
        pod_namespace=args.pod_namespace,
        pod_labels=pod_labels,
        shard=shard,
        endpoint_hosts=endpoint_hosts,
        broker_pod_security=args.broker_pod_security,
        broker_images=BrokerImages.parse(args.broker_images.split(",")),
        **_pod_defaults(args, parser),
        broker_tls=args.broker_tls,
        certificates_recheck_seconds=args.certificates_recheck_seconds,
        log=log_settings_from(parser, args, environ),
    )


def _add_broker_pod_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """The flags of what the operator gives every broker pod: the image and pull secrets unless its
    spec says otherwise (``PodDefaults``), and TLS as its spec asks, or not at all."""
    parser.add_argument(
        "--broker-tls",
        action=argparse.BooleanOptionalAction,
        default=_flag(environ.get("OPERATOR_BROKER_TLS", "true"), "OPERATOR_BROKER_TLS", parser),
        help="broker pods serve TLS as their spec.tls asks and are heartbeated over mutual TLS; "
        "--no-broker-tls: plain HTTP for every BrokerCluster (env OPERATOR_BROKER_TLS; default: true)",
    )
    parser.add_argument(
        "--broker-image",
        default=environ.get("OPERATOR_BROKER_IMAGE", "").strip() or DEFAULT_BROKER_IMAGE,
        help="the broker image of BrokerClusters without spec.image (env OPERATOR_BROKER_IMAGE; "
        f"default: {DEFAULT_BROKER_IMAGE})",
    )
    parser.add_argument(
        "--broker-image-pull-secrets",
        default=environ.get("OPERATOR_BROKER_IMAGE_PULL_SECRETS", ""),
        help="comma-separated Secret names every broker pod pulls its image with, before its "
        "BrokerCluster's spec.imagePullSecrets (env OPERATOR_BROKER_IMAGE_PULL_SECRETS); default: none",
    )


def _pod_defaults(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``--broker-image`` and ``--broker-image-pull-secrets``, checked, as ``ControllerSettings`` fields."""
    image = args.broker_image.strip()
    if not image or any(c.isspace() for c in image):
        parser.error(
            f"--broker-image / OPERATOR_BROKER_IMAGE ({args.broker_image!r}) must be an image reference"
        )
    try:
        return {
            "broker_image": image,
            "broker_image_pull_secrets": parse_pull_secrets(args.broker_image_pull_secrets),
        }
    except ValueError as error:
        parser.error(str(error))


def peering_priority_from(started: float | None = None, tie_break: int | None = None) -> int:
    """A kopf peering priority that is higher the earlier this process started.

    kopf lets only the highest-priority live peer handle resources, and pauses *all* peers that
    share a priority, so replicas need distinct ones. Older-is-higher keeps the replica that is
    handling the clusters in charge when another one (re)starts, instead of handing every cluster
    over on each restart; a restarted container re-registers under its pod's identity with its new,
    lower priority, which hands over at once. Milliseconds since the epoch, negated, times 1000
    plus a random tie-break (0..999): two replicas starting in the same millisecond still differ.
    """
    started_ms = int((time.time() if started is None else started) * 1000)
    tie = random.randrange(1000) if tie_break is None else tie_break
    return -(started_ms * 1000 + tie)
