"""The CA key replacement: the phases one by one, and a hypothesis model of brokers that load trust
bundles and certificates late, join and leave, under which no party ever meets a leaf of a CA it
does not trust, and which finishes once the brokers keep up."""

from __future__ import annotations

import functools
import itertools
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from broker_operator.pki import (
    ANNOTATION_REPLACE_CA_KEY,
    CertificateInfo,
    KeyPair,
    ReplacementPhase,
    ReplacementState,
    ReplacementStep,
    TrustObservations,
    advance,
    bundle_certificates,
    certificate_info,
    new_ca,
    trust_bundle,
)
from tests.unit.pki.conftest import NOW

BROKERS = frozenset({"orders-0", "orders-1", "orders-2"})
# None: every broker; else those of the set that exist (brokers added later are orders-3, -4...).
SOME_BROKERS = st.none() | st.sets(st.sampled_from([f"orders-{n}" for n in range(8)]))
RENEWALS = st.sampled_from(["both", "server", "client", "none"])
_serials = itertools.count(1)


@functools.cache
def pool() -> tuple[KeyPair, ...]:
    """Three CAs, made once (RSA-2048 to keep the model quick; the key size plays no part here)."""
    return tuple(new_ca(f"CA {n}", days=3650, now=NOW, key_bits=2048) for n in range(3))


@functools.cache
def key_id(ca: KeyPair) -> str:
    return ca.info().subject_key_id


def leaf_of(ca: KeyPair) -> CertificateInfo:
    """A leaf's parsed view as the rules read it: a serial and which CA key signed it."""
    serial = format(next(_serials), "x")
    return CertificateInfo(
        serial=serial,
        not_before=NOW,
        not_after=NOW + timedelta(days=90),
        subject="CN=leaf",
        issuer="CN=CA",
        dns_names=(),
        is_ca=False,
        subject_key_id=f"leaf{serial}",
        authority_key_id=key_id(ca),
        fingerprint=f"leaf{serial}",
    )


def observe(
    *,
    loaded: dict[str, str] | None = None,
    served: dict[str, str] | None = None,
    server: CertificateInfo | None = None,
    client: CertificateInfo | None = None,
    confirmed: bool = True,
) -> TrustObservations:
    return TrustObservations(BROKERS, loaded or {}, served or {}, server, client, confirmed)


def everyone(value: str) -> dict[str, str]:
    return dict.fromkeys(BROKERS, value)


def test_the_annotation_is_the_groups() -> None:
    assert ANNOTATION_REPLACE_CA_KEY == "broker.failover.dev/replace-ca-key"


def test_the_phases_in_order_with_a_reason_at_each_transition() -> None:
    old, new, newer = pool()
    made: list[KeyPair] = []

    def make() -> KeyPair:
        made.append(new)
        return new

    state = ReplacementState(ca=old, token="t0")
    quiet = advance(state, "t0", observe(), new_ca=make)
    assert (quiet.state, quiet.signing_ca, quiet.transition, quiet.waiting_for) == (state, old, None, None)
    assert quiet.trust_bundle == old.certificate_pem and made == []
    assert advance(state, None, observe(), new_ca=make).state == state  # no annotation: nothing
    assert advance(state, "", observe(), new_ca=make).state == state

    trusting = advance(state, "t1", observe(), new_ca=make)
    assert trusting.state.phase is ReplacementPhase.TRUSTING and made == [new]
    assert trusting.trust_bundle == trust_bundle(old.certificate_pem, new.certificate_pem)
    assert trusting.signing_ca == old  # no leaf of the new CA before everyone trusts it
    assert trusting.transition is not None and "CA key replacement 't1' started" in trusting.transition
    both = trusting.bundle_version

    waiting = advance(trusting.state, "t1", observe(loaded={"orders-0": both}, confirmed=False), new_ca=make)
    assert waiting.state == trusting.state and waiting.transition is None
    assert waiting.waiting_for == (
        f"waiting for orders-1, orders-2 to load trust bundle {both} (old and new CA); "
        "confirmation that clients outside the cluster (SAP STRUST, PI/PO) trust the new CA"
    )
    unconfirmed = advance(trusting.state, "t1", observe(loaded=everyone(both), confirmed=False), new_ca=make)
    assert unconfirmed.state.phase is ReplacementPhase.TRUSTING

    reissuing = advance(trusting.state, "t1", observe(loaded=everyone(both)), new_ca=make)
    assert reissuing.state.phase is ReplacementPhase.REISSUING
    assert (reissuing.signing_ca, reissuing.bundle_version) == (new, both)
    assert reissuing.transition == f"every broker trusts the new CA (bundle {both}): issuing leaves from it"

    old_server, old_client = leaf_of(old), leaf_of(old)
    new_server, new_client = leaf_of(new), leaf_of(new)
    pending = [
        (
            observe(server=old_server, client=old_client),
            "the server certificate to be issued from the new CA; "
            "the operator to present a client certificate of the new CA",
        ),
        (
            observe(server=new_server, client=new_client, served={"orders-0": new_server.serial}),
            f"orders-1, orders-2 to serve the new CA's server certificate (serial {new_server.serial})",
        ),
        (
            observe(server=new_server, client=old_client, served=everyone(new_server.serial)),
            "the operator to present a client certificate of the new CA",
        ),
    ]
    for observed, expected in pending:
        step = advance(reissuing.state, "t1", observed, new_ca=make)
        assert step.state == reissuing.state and step.waiting_for == f"waiting for {expected}"
        assert step.trust_bundle == reissuing.trust_bundle

    retiring = advance(
        reissuing.state,
        "t2",
        observe(server=new_server, client=new_client, served=everyone(new_server.serial)),
        new_ca=make,
    )
    assert retiring.state.phase is ReplacementPhase.RETIRING
    assert (retiring.state.ca, retiring.state.incoming, retiring.signing_ca) == (new, None, new)
    assert retiring.trust_bundle == new.certificate_pem
    assert retiring.transition is not None and "dropping the old CA" in retiring.transition

    assert advance(retiring.state, "t2", observe(loaded=everyone(both)), new_ca=make).state == retiring.state
    done = advance(retiring.state, "t2", observe(loaded=everyone(retiring.bundle_version)), new_ca=make)
    assert done.state == ReplacementState(ca=new, token="t1")
    assert done.transition == "CA key replacement 't1' done: every broker trusts the new CA alone"

    # "t2" came while "t1" ran: it starts now, with another new CA.
    again = advance(done.state, "t2", observe(), new_ca=lambda: newer)
    assert again.state.phase is ReplacementPhase.TRUSTING and again.state.incoming == newer
    assert again.state.token == "t2"


def test_a_state_that_contradicts_itself_is_refused() -> None:
    old, new, _ = pool()
    with pytest.raises(ValueError, match="in phase Trusting must hold a new CA"):
        ReplacementState(ca=old, phase=ReplacementPhase.TRUSTING)
    with pytest.raises(ValueError, match="in phase Done must not hold a new CA"):
        ReplacementState(ca=old, incoming=new)


def test_a_long_list_of_pending_brokers_is_cut_short() -> None:
    old, new, _ = pool()
    many = frozenset(f"orders-{n}" for n in range(8))
    step = advance(
        ReplacementState(ca=old, incoming=new, token="t", phase=ReplacementPhase.TRUSTING),
        "t",
        TrustObservations(many, {}, {}, None, None, True),
        new_ca=lambda: new,
    )
    assert step.waiting_for is not None and "orders-0, orders-1, orders-2, orders-3, orders-4 and 3 more" in (
        step.waiting_for
    )


class ReplacementModel(RuleBasedStateMachine):
    """The shell as it will run: each step publishes the bundle and reissues the leaves that are
    not of the signing CA; each broker loads the bundle and its certificate whenever it gets to
    it, and the operator its client certificate likewise; brokers come and go.
    """

    def __init__(self) -> None:
        super().__init__()
        cas = pool()
        self.cas = cas
        self.state = ReplacementState(ca=cas[0], token=None)
        self.requested: str | None = None
        self.confirmed = False
        self.names = itertools.count(3)
        nothing = TrustObservations(frozenset(), {}, {}, None, None, external_trust_confirmed=False)
        self.last: ReplacementStep = advance(self.state, None, nothing, new_ca=self.next_ca)
        self.publish(self.last)
        self.server, self.client = leaf_of(self.last.signing_ca), leaf_of(self.last.signing_ca)
        self.presented = self.client
        self.loaded: dict[str, tuple[str, frozenset[str]]] = {}
        self.served: dict[str, CertificateInfo] = {}
        for broker in sorted(BROKERS):
            self.start_broker(broker)

    @initialize(confirmed=st.booleans())
    def a_replacement_is_asked_for(self, confirmed: bool) -> None:
        """Every run starts with one asked for: the phases are what is under test."""
        self.requested, self.confirmed = "t1", confirmed

    # --- the world -----------------------------------------------------------------------------
    def next_ca(self) -> KeyPair:
        in_use = {self.state.ca, self.state.incoming}
        return next(ca for ca in itertools.cycle(self.cas) if ca not in in_use)

    def publish(self, step: ReplacementStep) -> None:
        self.published = (
            step.bundle_version,
            frozenset(certificate_info(c).subject_key_id for c in bundle_certificates(step.trust_bundle)),
        )

    def start_broker(self, broker: str) -> None:
        """A pod starts with the Secrets' content of the moment mounted."""
        self.loaded[broker] = self.published
        self.served[broker] = self.server

    def observed(self) -> TrustObservations:
        return TrustObservations(
            brokers=frozenset(self.loaded),
            loaded_bundles={broker: version for broker, (version, _) in self.loaded.items()},
            served_serials={broker: leaf.serial for broker, leaf in self.served.items()},
            server=self.server,
            client=self.presented,
            external_trust_confirmed=self.confirmed,
        )

    @rule()
    def step(self) -> None:
        self.last = advance(self.state, self.requested, self.observed(), new_ca=self.next_ca)
        assert self.last.state.phase is self.state.phase or self.last.transition, "a silent transition"
        self.state = self.last.state
        event(f"reached {self.state.phase}")
        self.publish(self.last)

    @rule(which=RENEWALS)
    def shell_renews(self, which: str = "both") -> None:
        """renewal.plan_renewal: a leaf not of the signing CA "does not verify against the current CA".
        Apart from the step, and one Secret at a time: a write may fail, the next step run before it."""
        signer = key_id(self.last.signing_ca)
        if which in {"server", "both"} and self.server.authority_key_id != signer:
            self.server = leaf_of(self.last.signing_ca)
        if which in {"client", "both"} and self.client.authority_key_id != signer:
            self.client = leaf_of(self.last.signing_ca)

    @rule(bundle_to=SOME_BROKERS, certificate_to=SOME_BROKERS, operator=st.booleans())
    def some_catch_up(
        self, bundle_to: set[str] | None, certificate_to: set[str] | None, operator: bool
    ) -> None:
        """Some brokers load the published bundle, some the server certificate, checked after each."""
        for broker in set(self.loaded) if bundle_to is None else bundle_to & set(self.loaded):
            self.loaded[broker] = self.published
        self.check_all()
        for broker in set(self.served) if certificate_to is None else certificate_to & set(self.served):
            self.served[broker] = self.server
        self.check_all()
        if operator:
            self.presented = self.client

    @rule(renews=RENEWALS, bundle_to=SOME_BROKERS, certificate_to=SOME_BROKERS, operator=st.booleans())
    def step_then_some_catch_up(
        self, renews: str, bundle_to: set[str] | None, certificate_to: set[str] | None, operator: bool
    ) -> None:
        """The rules above in the shell's order, checked after each: hypothesis reaches the late
        phases in a few of these."""
        self.step()
        self.check_all()
        self.shell_renews(renews)
        self.check_all()
        self.some_catch_up(bundle_to, certificate_to, operator)

    @rule()
    def names_change(self) -> None:
        """A scale-up or a new cluster domain: the server certificate is reissued by the signing CA."""
        self.server = leaf_of(self.last.signing_ca)

    @rule(token=st.sampled_from([None, "t1", "t2", "t3"]), confirmed=st.booleans())
    def annotate(self, token: str | None, confirmed: bool) -> None:
        """The replacement annotation, and a person's confirmation that SAP trusts the new CA."""
        self.requested, self.confirmed = token, confirmed

    @rule(change=st.sampled_from(["add", "remove", "restart"]), data=st.data())
    def membership(self, change: str, data: st.DataObject) -> None:
        """A broker joins (with what is mounted now), leaves, or restarts (and so loads everything)."""
        if change == "add" and len(self.loaded) < 5:
            self.start_broker(f"orders-{next(self.names)}")
        elif self.loaded and change != "add":
            broker = data.draw(st.sampled_from(sorted(self.loaded)))
            if change == "remove":
                del self.loaded[broker], self.served[broker]
            else:
                self.start_broker(broker)

    @rule()
    def brokers_keep_up(self) -> None:
        """Once everyone keeps up, a replacement asked for finishes, with one CA left in trust."""
        self.confirmed = True
        for _ in range(12):
            self.step()
            self.shell_renews()
            self.check_all()
            for broker in self.loaded:
                self.start_broker(broker)
            self.presented = self.client
        assert self.state.phase is ReplacementPhase.DONE, self.last.waiting_for
        assert not self.requested or self.state.token == self.requested
        assert self.last.trust_bundle == self.state.ca.certificate_pem

    # --- what must always hold ----------------------------------------------------------------
    def check_all(self) -> None:
        self.the_operator_trusts_every_certificate_a_broker_serves()
        self.every_broker_trusts_every_certificate_in_use()
        self.the_signing_ca_is_in_the_published_bundle()

    @invariant()
    def the_operator_trusts_every_certificate_a_broker_serves(self) -> None:
        _, trusted = self.published
        for broker, leaf in self.served.items():
            assert leaf.authority_key_id in trusted, f"the operator no longer trusts what {broker} serves"

    @invariant()
    def every_broker_trusts_every_certificate_in_use(self) -> None:
        in_use = {
            "the operator's client certificate": self.presented,
            "the client certificate in the Secret": self.client,
            "the server certificate in the Secret": self.server,
            **{f"{broker}'s server certificate": leaf for broker, leaf in self.served.items()},
        }
        for broker, (_, trusted) in self.loaded.items():
            for what, leaf in in_use.items():
                assert leaf.authority_key_id in trusted, f"{broker} does not trust {what}"

    @invariant()
    def the_signing_ca_is_in_the_published_bundle(self) -> None:
        assert key_id(self.last.signing_ca) in self.published[1]
        assert len(self.published[1]) == (2 if self.state.incoming is not None else 1)


ReplacementModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_replacement_model = ReplacementModel.TestCase
