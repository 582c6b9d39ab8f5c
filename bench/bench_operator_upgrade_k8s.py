"""``helm upgrade``, kill -9 and a standby's start of the operator under traffic, on the real node,
through the real Service, against two controls.

Issue 40's real-node figure. Setup (``local_cluster.relay``): the sealed cluster (a real kubelet,
containerd, kube-proxy in nftables mode, CoreDNS), the chart installed with its defaults (nothing
set but the namespace to watch: its replicas, peering and update strategy are what a user gets),
the example BrokerCluster as it is (heartbeat every 1 s, a 10 s lease), and the backend and cloud
simulators as pods; the backend sends to ``https://orders-active.<ns>.svc:8080`` by DNS, fed
200 msg/s as one message per stream every 20 ms (4 streams; a bundle about every 20 ms, as in
bench-drain), connects given up after 30 ms and fast failures retried every 20 ms
(``FAST_RETRYING_CLIENT``), so a client's backoff is not counted as the upgrade's.

Three kinds of round, taken in turn, each a steady window of ``--steady`` seconds, then the act,
then ``--settle`` seconds more (a lease nobody renewed would run out in there, for the example's
lease):

- ``upgrade`` (``--upgrades``): ``helm upgrade --reuse-values`` with the operator pod's CPU request
  changed (``local_cluster.operator_upgrade``: a new ReplicaSet rolls, the old pod gets SIGTERM),
  until the old pod is gone and the new one Ready, then until the new pod has made heartbeats;
- ``kill`` (``--kills``): kill -9 of the operator's container (an OOM kill), until the container the
  kubelet started again has made heartbeats; the time from the kill to then is printed, to set
  against the lease;
- ``standby`` (``--standbys``), a control: the Deployment scaled to two replicas until the new pod
  is Ready (it starts as a peering standby and handles nothing), then back to one until it is
  gone. The same image, imports and startup as an upgrade's new pod on the same node, without the
  handover: a pause here is the cost of starting a pod on this node, not of the operator's
  design;
- ``noop`` (``--noops``), the other control: the same ``helm upgrade --reuse-values --wait`` with no
  value changed, so no pod is replaced: the cost of running helm itself (a Go program rendering
  the chart on the same two cores, and the reads and writes it makes).

At the end traffic stops, everything is confirmed both ways and the simulators' records are
checked (lost, twice, out of order: any of them, exit 1).

Figures, from the brokers' own message logs (their ``confirmed`` records of outbound messages:
the confirmation back to the backend, the end of a message's path; microsecond timestamps, one
clock: the node shares the machine's), so no poll's period is in them:

- the longest pause in confirmed traffic in each round's window (from the act to the end of the
  settle): per kind, ``operator_<kind>_max_pause_s``; the headline is the upgrade's;
- the normal gap between bundles, from the steady windows of the same run: the median gap between
  two confirmations and the longest gap in a steady window; ``operator_<kind>_pause_ratio`` is the
  kind's longest pause over that longest steady gap (goal: 1 or so, no worse than steady traffic;
  issue 40's goal is a pause no longer than the normal gap between bundles, well under 1 s), and
  ``operator_upgrade_vs_controls_pause`` sets the upgrade against the longer of the controls';
- ``activated`` and ``deactivated`` records in each window (goal 0: a self-fenced active and its
  re-activation under a new epoch show here), per kind ``operator_<kind>_reactivations`` and
  ``operator_<kind>_new_epochs`` (the status epoch before and after).

A text timeline per round shows where the pause is: one column per slice of the window, ``|``
where confirmations went on, blank where none did, with the act (``h``: helm upgrade, ``k``: kill,
``s``: scaled up, ``o``: helm upgrade changing nothing), a new container's start (``n``, to the
second: the API's timestamps), the end of the act (``x``: the old pod gone, the standby gone, the
restarted container heartbeating, helm done) and any activation (``A``) or deactivation (``D``)
marked under it.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from broker_contracts.message_log import Direction, Event, MessageLogError, decode, parse_ts
from local_cluster.cluster import LocalClusterSettings, built_tools_dir
from local_cluster.operator_upgrade import OPERATOR_PODS, operator_heartbeats, operator_pods, upgrade_operator
from local_cluster.relay import (
    CHART,
    FAST_RETRYING_CLIENT,
    MESSAGE_LOG_CLAIM,
    Feeder,
    Relay,
    RelayError,
    deploy_relay,
    wait_until,
)
from local_cluster.sealed_cluster import SealedCluster, start_sealed_cluster
from local_cluster.soak_faults import broker_metrics

STREAMS = 4
PER_STREAM_PER_TICK = 1
TICK = 0.02
TIMELINE_COLUMNS = 100


KINDS = ("upgrade", "kill", "standby", "noop")
ACT_MARKS = {"upgrade": "h", "kill": "k", "standby": "s", "noop": "o"}
CONTROLS = ("standby", "noop")


@dataclass
class Round:
    kind: str  # one of KINDS
    steady_from: float  # wall seconds
    began: float  # the act: helm upgrade, kill -9, scale up
    done: float  # the old pod gone, the restarted container heartbeating, the standby gone
    until: float
    new_started: float | None  # a new container's start, as the kubelet reports it (to 1 s)
    epochs: tuple[object, object]
    what: str  # which pods, for the round's line
    pause: float = 0.0
    steady_longest: float = 0.0
    steady_gaps: list[float] = field(default_factory=list)
    activations: list[float] = field(default_factory=list)
    deactivations: list[float] = field(default_factory=list)


@dataclass
class Logged:
    """The brokers' message-log records this benchmark reads, as wall seconds, sorted."""

    confirmed: list[float]  # distinct instants of outbound confirmations
    activated: list[float]
    deactivated: list[float]


def read_message_logs(store: Path) -> Logged:
    confirmed: set[float] = set()
    lifecycle: dict[str, list[float]] = {Event.ACTIVATED.value: [], Event.DEACTIVATED.value: []}
    for segment in sorted(store.glob("*/*/*.jsonl*")):
        for line in segment.read_text(encoding="utf-8").splitlines():
            try:
                record = decode(line)
            except MessageLogError:
                continue  # a torn last line of an open segment
            at = parse_ts(record["ts"]).timestamp()
            if (
                record["event"] == Event.CONFIRMED.value
                and record.get("direction") == Direction.OUTBOUND.value
            ):
                confirmed.add(at)
            elif record["event"] in lifecycle:
                lifecycle[record["event"]].append(at)
    return Logged(
        sorted(confirmed),
        sorted(lifecycle[Event.ACTIVATED.value]),
        sorted(lifecycle[Event.DEACTIVATED.value]),
    )


def gaps_in(instants: list[float], start: float, end: float) -> list[float]:
    """The gaps from ``start`` through each instant inside (start, end]; with none, the whole window
    (the time after the last one is not a pause: traffic was flowing again)."""
    inside = [t for t in instants if start < t <= end]
    bounds = [start, *inside] if inside else [start, end]
    return [later - earlier for earlier, later in itertools.pairwise(bounds)]


def measure(round_: Round, logged: Logged) -> None:
    round_.pause = max(gaps_in(logged.confirmed, round_.began, round_.until))
    steady = gaps_in(logged.confirmed, round_.steady_from, round_.began)
    round_.steady_gaps, round_.steady_longest = steady[1:] or steady, max(steady)
    round_.activations = [t for t in logged.activated if round_.began <= t <= round_.until]
    round_.deactivations = [t for t in logged.deactivated if round_.began <= t <= round_.until]


def timeline(round_: Round, logged: Logged) -> list[str]:
    """Two text rows over the round's window (from a second before its act)."""
    start, end = round_.began - 1.0, round_.until
    width = (end - start) / TIMELINE_COLUMNS

    def column(at: float) -> int:
        return min(TIMELINE_COLUMNS - 1, max(0, int((at - start) / width)))

    traffic = [" "] * TIMELINE_COLUMNS
    for at in logged.confirmed:
        if start <= at <= end:
            traffic[column(at)] = "|"
    marks = ["-"] * TIMELINE_COLUMNS
    for at, mark in (
        (round_.began, ACT_MARKS[round_.kind]),
        *(((round_.new_started, "n"),) if round_.new_started is not None else ()),
        (round_.done, "x"),
        *((at, "A") for at in round_.activations),
        *((at, "D") for at in round_.deactivations),
    ):
        marks[column(at)] = mark
    return [
        f"    confirmed [{''.join(traffic)}]",
        f"              [{''.join(marks)}] {end - start:.1f} s, {width * 1000:.0f} ms a column",
    ]


def new_operator_heartbeating(relay: Relay, before: dict[str, float]) -> bool:
    return any(count > before.get(key, 0.0) for key, count in operator_heartbeats(relay).items())


def active_in_its_term(relay: Relay) -> bool:
    """The status's active is Active at the status's epoch by its own metrics: after a fence (a
    lease that ran out) only once the new operator has activated it again and recorded that."""
    status = relay.status()
    own = broker_metrics(relay, str(status.get("active")))
    return own.get("broker_active") == 1 and own.get("broker_epoch") == status.get("epoch")


def run_round(relay: Relay, kind: str, steady: float, settle: float) -> Round:
    steady_from = time.time()
    time.sleep(steady)
    epoch = relay.status().get("epoch")
    counts = operator_heartbeats(relay)
    began = time.time()
    if kind == "upgrade":
        roll = upgrade_operator(relay)
        done = time.time()
        wait_until(
            "the new operator pod heartbeating", lambda: new_operator_heartbeating(relay, counts), 120, 0.25
        )
        new, what = roll.after, f"{', '.join(sorted(roll.before))} -> {', '.join(sorted(roll.after))}"
    elif kind == "kill":
        victim = sorted(operator_pods(relay))[0]  # the chart's default: the one replica
        relay.kill_9(victim)
        # Polled often: the time from the kill to here is set against the lease.
        wait_until(
            "the restarted operator heartbeating", lambda: new_operator_heartbeating(relay, counts), 120, 0.1
        )
        done = time.time()
        new, what = {victim: ""}, victim
    elif kind == "standby":
        new, done = start_and_stop_a_standby(relay)
        what = ", ".join(sorted(new))
    elif kind == "noop":
        relay.cluster.helm(
            "upgrade", relay.release, str(CHART), "--namespace", relay.namespace, "--reuse-values",
            "--wait", "--timeout=240s", timeout=300,
        )  # fmt: skip
        done, new, what = time.time(), {}, "with no value changed"
    else:
        raise ValueError(f"unknown kind of round {kind!r}")
    time.sleep(settle)
    epochs = (epoch, relay.status().get("epoch"))
    return Round(kind, steady_from, began, done, time.time(), started(relay, new), epochs, what)


def start_and_stop_a_standby(relay: Relay) -> tuple[dict[str, str], float]:
    """Scale the operator's Deployment to two replicas until the new pod is Ready, then back to
    one until it is gone (the newest pod goes first); the new pod and when it was gone."""
    before = operator_pods(relay)
    deployments = (relay.get("deployments", "-l", OPERATOR_PODS) or {}).get("items") or []
    if len(deployments) != 1:
        raise RelayError(f"{len(deployments)} operator Deployments in {relay.namespace}, not one")
    deployment = f"deployment/{deployments[0]['metadata']['name']}"
    relay.cluster.kubectl("-n", relay.namespace, "scale", deployment, "--replicas=2")

    def standby_ready() -> dict[str, str] | None:
        new = {name: uid for name, uid in operator_pods(relay).items() if name not in before}
        return new if new and all(relay.pod_ready(name) for name in new) else None

    new = dict(wait_until("the standby operator pod Ready", standby_ready, 120, 0.25))
    # started() reads the pod: before it goes.
    relay.cluster.kubectl("-n", relay.namespace, "scale", deployment, "--replicas=1")
    wait_until("the standby gone", lambda: not set(new) & set(operator_pods(relay)), 120, 0.25)
    return new, time.time()


def started(relay: Relay, pods: dict[str, str]) -> float | None:
    """When the (first) new operator container started, in wall seconds (the API's timestamps
    have whole seconds), or None if it is not running (a standby already gone)."""
    for name in sorted(pods):
        statuses = ((relay.get("pod", name) or {}).get("status") or {}).get("containerStatuses") or [{}]
        at = ((statuses[0].get("state") or {}).get("running") or {}).get("startedAt")
        if at:
            return datetime.strptime(str(at), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    return None


def report(rounds: list[Round], logged: Logged) -> dict[str, float]:
    """Print each round, its timeline and the figures; the longest pause of each kind run."""
    for index, round_ in enumerate(rounds, start=1):
        measure(round_, logged)
        before, after = round_.epochs
        epoch = f"epoch {before} kept" if before == after else f"NEW EPOCH {before} -> {after}"
        act = {"upgrade": "helm upgrade", "kill": "kill -9", "standby": "standby", "noop": "helm upgrade"}[
            round_.kind
        ]
        ended = {"upgrade": "old pod gone", "kill": "heartbeating again", "standby": "gone", "noop": "done"}[
            round_.kind
        ]
        print(
            f"[{index}/{len(rounds)}] {act} {round_.what}: {ended} after "
            f"{round_.done - round_.began:.1f} s; longest pause in confirmed traffic "
            f"{round_.pause * 1000:.0f} ms (steady window before it: {round_.steady_longest * 1000:.0f} ms); "
            f"activations {len(round_.activations)}, deactivations {len(round_.deactivations)}; {epoch}"
        )
        for row in timeline(round_, logged):
            print(row)
    steady_gaps = [gap for r in rounds for gap in r.steady_gaps]
    steady_longest = max(r.steady_longest for r in rounds)
    print(
        f"normal gap between bundles (confirmations, steady windows): median "
        f"{statistics.median(steady_gaps) * 1000:.0f} ms, longest {steady_longest * 1000:.0f} ms"
    )
    longest: dict[str, float] = {}
    for kind in KINDS:
        of_kind = [r for r in rounds if r.kind == kind]
        if not of_kind:
            continue
        longest[kind] = max(r.pause for r in of_kind)
        pauses = ", ".join(f"{r.pause * 1000:.0f}" for r in of_kind)
        print(f"{kind}: pauses {pauses} ms (median {statistics.median(r.pause for r in of_kind) * 1000:.0f})")
        print(f"operator_{kind}_reactivations={sum(len(r.activations) for r in of_kind)}")
        print(f"operator_{kind}_new_epochs={sum(r.epochs[0] != r.epochs[1] for r in of_kind)}")
        print(f"operator_{kind}_pause_ratio={longest[kind] / steady_longest:.2f}")
        if kind != "upgrade":
            print(f"operator_{kind}_max_pause_s={longest[kind]:.3f}")
    controls = [longest[kind] for kind in CONTROLS if kind in longest]
    if "upgrade" in longest and controls:
        print(f"operator_upgrade_vs_controls_pause={longest['upgrade'] / max(controls):.2f}")
    return longest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--upgrades", type=int, default=5)
    parser.add_argument("--kills", type=int, default=3, help="kill -9 rounds (3: kubelet backoff stays 10 s)")
    parser.add_argument(
        "--standbys", type=int, default=3, help="control rounds: a standby started and stopped"
    )
    parser.add_argument(
        "--noops", type=int, default=3, help="control rounds: a helm upgrade changing nothing"
    )
    parser.add_argument("--steady", type=float, default=15.0, help="seconds of steady traffic before each")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds after the new pod heartbeats")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="the cluster's files (default: a new directory in /tmp)"
    )
    options = parser.parse_args(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the cluster below is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = options.workdir or Path(tempfile.mkdtemp(prefix="bench-operator-upgrade-k8s-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"starting the sealed local cluster in {work}", flush=True)
    cluster: SealedCluster = start_sealed_cluster(
        LocalClusterSettings(tools_dir=built_tools_dir(), workdir=work / "cluster")
    )
    rounds: list[Round] = []
    try:
        namespace = f"bench-upgrade-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", namespace)
        relay = deploy_relay(
            cluster, namespace, streams=STREAMS, messages_per_stream=10, client=FAST_RETRYING_CLIENT
        )
        feeder = Feeder(relay, PER_STREAM_PER_TICK, TICK).start()
        relay.backend("/sim/start", {})
        wait_until("traffic flowing", lambda: int(relay.backend("/sim/status")["confirmed"]) > 0, 60)
        # In turn, so that each kind meets the same machine; a kill after an upgrade hits a new pod,
        # whose restart the kubelet does not hold back.
        wanted = {
            "upgrade": options.upgrades,
            "kill": options.kills,
            "standby": options.standbys,
            "noop": options.noops,
        }
        turns = [kind for index in range(max(wanted.values())) for kind in KINDS if index < wanted[kind]]
        print(
            f"{', '.join(f'{n} {kind}' for kind, n in wanted.items())} rounds under "
            f"{STREAMS * PER_STREAM_PER_TICK / TICK:.0f} msg/s through "
            f"https://orders-active.{namespace}.svc:8080, the chart's defaults and the example's heartbeat "
            f"({options.steady:g} s steady before each, {options.settle:g} s settle after)",
            flush=True,
        )
        for index, kind in enumerate(turns, start=1):
            rounds.append(run_round(relay, kind, options.steady, options.settle))
            print(f"  round {index}/{len(turns)} done: {kind} {rounds[-1].what}", flush=True)
        feeder.stop.set()
        relay.wait_all_confirmed()
        records = relay.record_violations()
        store = cluster.claim_volume_path(namespace, MESSAGE_LOG_CLAIM)
    finally:
        cluster.stop()
    # Read once the brokers are gone: a running broker renames the segment it closes, and a file
    # listed a moment earlier is then gone (FileNotFoundError on a .jsonl.open).
    logged = read_message_logs(store)
    longest = report(rounds, logged)
    print(f"lost {records['lost']}, twice {records['twice']}, out of order {records['out-of-order']}")
    passed = sum(records.values()) == 0
    if passed and options.workdir is None:
        shutil.rmtree(work, ignore_errors=True)  # etcd data and logs
    elif not passed:
        print(f"the cluster's logs are kept for a look: {work / 'cluster' / 'logs'}", file=sys.stderr)
    print(f"operator_upgrade_max_pause_s={longest.get('upgrade', 0.0):.3f}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
