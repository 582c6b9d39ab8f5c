"""The broker's Prometheus metrics, served at ``/metrics``.

One registry per broker object (not the process-global default), so a test can
run two brokers' worth of code in one interpreter without their counters
mixing. Counters move once per batch (``inc(n)``), never once per message, to
stay off the hot path's profile.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.active = Gauge("broker_active", "1 while this broker is Active, else 0", registry=r)
        self.epoch = Gauge("broker_epoch", "The broker's durably stored epoch", registry=r)
        self.heartbeats = Counter("broker_heartbeats", "Heartbeat calls by answer", ["state"], registry=r)
        self.stalls = Counter(
            "broker_event_loop_stalls",
            "Lease-watcher ticks that found the event loop stalled longer than the lease margin",
            registry=r,
        )
        self.accepted = Counter("broker_messages_accepted", "Messages journaled and acknowledged", registry=r)
        self.duplicates = Counter("broker_messages_duplicate", "Old seqs acknowledged again", registry=r)
        self.gaps = Counter("broker_messages_gap", "Messages refused because of a seq gap", registry=r)
        self.delivered = Counter(
            "broker_messages_delivered", "Messages the target took", ["direction"], registry=r
        )
        self.confirmed = Counter(
            "broker_messages_confirmed", "Messages confirmed to their source", ["direction"], registry=r
        )
        self.rejected = Counter(
            "broker_deliveries_rejected", "Per-message delivery refusals", ["direction"], registry=r
        )
        self.held = Gauge("broker_messages_held", "Messages on the hold queue", ["direction"], registry=r)
        self.blocked_streams = Gauge(
            "broker_streams_blocked",
            "Streams stopped at a held message (BlockStream)",
            ["direction"],
            registry=r,
        )
        self.journal_group_commits = Gauge(
            "broker_journal_group_commits", "Journal group commits so far (one fsync each)", registry=r
        )
        self.accept_seconds = Histogram(
            "broker_bundle_accept_seconds",
            "SendMessages latency from request to acknowledgement",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        # Refused credentials by the role the call needed and why (credentials.AuthFailure): a
        # rising count is someone guessing or a rotation gone wrong. Never the presented value.
        self.auth_failures = Counter(
            "broker_auth_failures",
            "Calls refused for their credential, by the role the call needed and the reason",
            ["role", "reason"],
            registry=r,
        )
        # TLS listeners (listener_tls.py): which certificate each serves now, and its reloads.
        self.tls_serving_certificate = Gauge(
            "broker_tls_serving_certificate",
            "1 for the serial of the certificate each TLS listener serves to new connections",
            ["listener", "serial"],
            registry=r,
        )
        # The CA bundle the admin port verifies the operator's client certificate against, by its
        # version (broker_contracts.tls.bundle): what a CA key replacement waits on.
        self.tls_trust_bundle = Gauge(
            "broker_tls_trust_bundle",
            "1 for the version of the CA bundle each TLS listener trusts for client certificates",
            ["listener", "version"],
            registry=r,
        )
        # Also listener="upstream": the bundle the broker's own calls verify the backend and the
        # cloud against (--upstream-ca-file, upstream_tls.py), followed like the listeners' files.
        self.tls_reloads = Counter(
            "broker_tls_reloads",
            "Rotated TLS files taken up by new connections (listener main, admin, or upstream: the "
            "broker's calls to the backend and the cloud)",
            ["listener"],
            registry=r,
        )
        self.tls_reload_failures = Counter(
            "broker_tls_reload_failures",
            "Changed TLS files that did not load (the listener, or upstream, kept what it had)",
            ["listener"],
            registry=r,
        )
        self.relay_failures = Counter(
            "broker_relay_failures", "Calls to a target that failed in transport", ["target"], registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
