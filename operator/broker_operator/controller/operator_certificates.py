"""Mode Operator, the decisions: from ``<name>-ca``, ``<name>-tls`` and ``<name>-operator-client`` as
read, what to issue and write.

One synchronous function, :func:`plan_and_issue`, which the shell (``certificates.py``) runs in a
worker thread because making an RSA-3072 key takes a second of CPU: it refuses Secrets this
BrokerCluster does not own, asks ``pki.plan_renewal`` what is due (the CA first), issues exactly
that with ``pki.authority`` (a leaf from the CA that results), and says which of the two Secrets
must be written with which bytes. When nothing is due it issues nothing, and the bytes it would
write equal those held, so the shell writes nothing: an idle pass costs two reads and no write.

- ``<name>-tls``'s ``ca.crt`` is the trust bundle of the current CA certificate, so a same-key
  CA renewal rewrites it even though no leaf is due (the brokers and SAP see the renewed CA).
- ``<name>-operator-client``'s ``ca.crt`` is the same trust bundle: what the brokers' certificate
  chains to, which the operator (and ``kubectl broker``) verify the brokers against.
- Upgrade from the layout that kept the operator's client certificate in ``<name>-ca``
  (``tls_secrets.LEGACY_CLIENT_KEYS``): while ``<name>-operator-client`` is absent, the pair is read
  from there and written, unchanged, into ``<name>-operator-client`` (no reissue: a renewal only
  when it is due anyway); a later pass that finds ``<name>-operator-client`` stored, ours and
  holding what it would write drops the keys from ``<name>-ca``. Never in the same pass: a create
  refused or lost would otherwise lose the pair with it.
- A CA that cannot be read raises no new key: ``pki.plan_renewal`` refuses it, and this says
  Invalid with what to do, because a new CA silently made would leave every client that trusts
  the old one (SAP's STRUST among them) refusing the brokers.
- Replacing the CA's key (``pki.replacement``; the state in ``<name>-ca`` and the annotations:
  ``ca_replacement.py``): each pass with a CA calls ``advance`` once, before the renewals. The
  step's ``signing_ca`` is "the current CA" the leaves are checked against and issued from (so
  the Reissuing phase reissues both leaves by the ordinary rule), and its ``trust_bundle`` is the
  ``ca.crt`` of ``<name>-tls`` and ``<name>-operator-client``. A same-key renewal of the CA waits
  while a replacement is under way (the old CA is on its way out, the new one is fresh; renewing
  either would change the bundle the phase waits on). A pass that makes the CA records the
  annotation's value of that moment as done, so that making a CA starts no replacement.

What it does not do: call the API, post events (it returns the renewals that happened), or look
at the clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from broker_operator.controller import ca_replacement as replacing
from broker_operator.controller import names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.controller.certificate_report import (
    CA,
    INVALID,
    NOT_OWNED,
    OPERATOR_CLIENT,
    SERVER,
    Entry,
    Problem,
)
from broker_operator.pki import (
    CertificateError,
    CertificateInfo,
    KeyPair,
    Materials,
    Renewal,
    RenewalPolicy,
    ReplacementPhase,
    ReplacementState,
    ReplacementStep,
    Target,
    TrustObservations,
    Verb,
    advance,
    issue_client,
    issue_server,
    new_ca,
    plan_renewal,
    renew_ca,
    trust_bundle,
)


def ca_common_name(namespace: str, cluster: str) -> str:
    """The CA's commonName: which BrokerCluster it is for, cut to the 64 characters X.509 allows."""
    return f"broker-failover CA {namespace}/{cluster}"[:64]


@dataclass(frozen=True)
class OperatorSecrets:
    """``<name>-ca``, ``<name>-tls`` and ``<name>-operator-client`` as the API server returned them
    (None: absent)."""

    ca: Mapping[str, Any] | None
    tls: Mapping[str, Any] | None
    client: Mapping[str, Any] | None = None

    @property
    def client_in_ca(self) -> bool:
        """The operator's client certificate is still where the previous layout kept it."""
        return self.client is None and bool(shapes.legacy_client_keys(self.ca))

    def materials(self) -> Materials:
        if self.client_in_ca:
            client = shapes.key_pair(
                self.ca, shapes.LEGACY_CLIENT_CERT_KEY, shapes.LEGACY_CLIENT_KEY_KEY, what="CA Secret"
            )
        else:
            client = shapes.key_pair(
                self.client, shapes.TLS_CERT_KEY, shapes.TLS_KEY_KEY, what="operator client Secret"
            )
        return Materials(
            ca=shapes.key_pair(self.ca, shapes.CA_CERT_KEY, shapes.CA_KEY_KEY, what="CA Secret"),
            server=shapes.key_pair(self.tls, shapes.TLS_CERT_KEY, shapes.TLS_KEY_KEY, what="TLS Secret"),
            client=client,
        )

    def entries(self, cluster: str) -> tuple[Entry, ...]:
        """What is stored now, as ``status.tls.certificates[]``."""
        return entries_of(cluster, self.materials(), client_in_ca=self.client_in_ca)


@dataclass(frozen=True)
class Outcome:
    """What one pass found and did, for the shell to write and report."""

    entries: tuple[Entry, ...] = ()
    problems: tuple[Problem, ...] = ()
    renewals: tuple[Renewal, ...] = ()  # carried out: each becomes an event once written
    ca_data: dict[str, bytes] | None = field(default=None, repr=False)  # to write to <name>-ca
    tls_data: dict[str, bytes] | None = field(default=None, repr=False)  # to write to <name>-tls
    client_data: dict[str, bytes] | None = field(default=None, repr=False)  # to <name>-operator-client
    # keys to drop from <name>-ca (the previous layout's client pair, a finished replacement's new CA)
    ca_removed: tuple[str, ...] = ()
    foreign_tls: bool = False  # <name>-tls exists and is not ours: a pod must not mount it
    replacement: ReplacementStep | None = field(default=None, repr=False)  # this pass's step
    replacement_status: dict[str, str] | None = None  # status.tls.caReplacement after it


def _info(pair: KeyPair | None) -> CertificateInfo | None:
    if pair is None:
        return None
    try:
        return pair.info()
    except CertificateError:
        return None


def entries_of(cluster: str, materials: Materials, *, client_in_ca: bool = False) -> tuple[Entry, ...]:
    ca_name, tls_name = names.ca_secret_name(cluster), names.tls_secret_name(cluster)
    client_name = ca_name if client_in_ca else names.operator_client_secret_name(cluster)
    return (
        Entry(CA, ca_name, _info(materials.ca)),
        Entry(SERVER, tls_name, _info(materials.server)),
        Entry(OPERATOR_CLIENT, client_name, _info(materials.client)),
    )


def _not_owned(namespace: str, secret: Mapping[str, Any], name: str, role: str) -> Problem:
    owner = shapes.recorded_owner(secret)
    whose = f"recorded as BrokerCluster uid {owner}'s" if owner else "not recorded as the operator's"
    return Problem(
        NOT_OWNED,
        f"Secret {namespace}/{name} ({role}) exists and is {whose} (label "
        f"{shapes.LABEL_CERTIFICATES_OWNER}), so the operator does not overwrite it: delete or rename it to "
        "have the operator issue its own, or set spec.tls.mode: Secrets to use certificates of your own",
    )


def plan_and_issue(
    secrets: OperatorSecrets,
    *,
    owner: Mapping[str, Any],
    dns_names: tuple[str, ...],
    policy: RenewalPolicy,
    now: datetime,
    seen: replacing.Seen | None = None,
) -> Outcome:
    """Issue what is due, and what to write; runs in a worker thread (key generation). ``seen``:
    what the heartbeats saw, for a CA key replacement (none: nothing seen, so no phase that waits
    on the brokers moves)."""
    meta = owner["metadata"]
    namespace, cluster, uid = meta["namespace"], meta["name"], str(meta.get("uid") or "")
    problems = []
    for secret, name, role in (
        (secrets.ca, names.ca_secret_name(cluster), "the cluster's CA"),
        (secrets.tls, names.tls_secret_name(cluster), "the brokers' certificate"),
        (secrets.client, names.operator_client_secret_name(cluster), "the operator's client certificate"),
    ):
        if secret is not None and shapes.ownership(secret, uid) is shapes.Ownership.FOREIGN:
            problems.append(_not_owned(namespace, secret, name, role))
    foreign_tls = secrets.tls is not None and shapes.ownership(secrets.tls, uid) is shapes.Ownership.FOREIGN
    if problems:
        return Outcome(problems=tuple(problems), foreign_tls=foreign_tls)
    held = secrets.materials()
    client_name = shapes.OPERATOR_CLIENT_NAME
    request = replacing.request_of(owner)
    common_name = ca_common_name(namespace, cluster)
    step: ReplacementStep | None = None
    try:
        if held.ca is not None and secrets.ca is not None:
            state = replacing.read_state(secrets.ca, held.ca)
            observed = _observations(seen or replacing.Seen(), held, state, request)
            step = advance(
                state, request.token, observed,
                new_ca=lambda: new_ca(common_name, days=policy.ca_days, now=now),
            )  # fmt: skip
            held = replace(held, ca=step.signing_ca)
        renewals = plan_renewal(
            held, server_dns_names=dns_names, client_name=client_name, policy=policy, now=now
        )
        if step is not None and step.state.phase is not ReplacementPhase.DONE:
            renewals = tuple(r for r in renewals if r.target is not Target.CA)  # module doc
        issued = _issue(held, renewals, dns_names=dns_names, policy=policy, now=now, common_name=common_name)
    except CertificateError as error:
        message = (
            f"Secret {namespace}/{names.ca_secret_name(cluster)}: {error}. The operator makes no new CA "
            "key on its own (every client that trusts the old CA, SAP's STRUST among them, would refuse "
            "the brokers): restore the Secret, or delete it to have a new CA made and give the new ca.crt of "
            f"{names.tls_secret_name(cluster)} to everyone who trusts the old one"
        )
        return Outcome(secrets.entries(cluster), (Problem(INVALID, message),))
    assert issued.ca is not None and issued.server is not None and issued.client is not None  # _issue
    if step is None:  # the CA is made now: the annotation's value of this moment is no request
        state = ReplacementState(ca=issued.ca, token=request.token)
        bundle = trust_bundle(issued.ca.certificate_pem)
    elif issued.ca is not held.ca:  # renewed with the same key (phase Done only: above)
        state = replace(step.state, ca=issued.ca)
        bundle = trust_bundle(issued.ca.certificate_pem)
    else:
        state, bundle = step.state, step.trust_bundle
    ca_data = replacing.state_data(state)
    tls_data = shapes.tls_secret_data(issued.server, bundle)
    client_data = shapes.operator_client_secret_data(issued.client, bundle)
    client_stored = shapes.held_data(secrets.client, shapes.OPERATOR_CLIENT_SECRET_KEYS) == client_data
    # The previous layout's pair goes only once its new home is stored as it should be (module doc).
    removed = shapes.legacy_client_keys(secrets.ca) if client_stored else ()
    removed += replacing.stale_keys(secrets.ca, ca_data)
    ca_held = shapes.held_data(secrets.ca, tuple(ca_data)) == ca_data
    status = None
    if step is not None:
        confirmed = request.trusted is not None and request.trusted == step.state.token
        reported = bool((seen or replacing.Seen()).loaded_bundles)
        status = replacing.status_of(
            step, namespace=namespace, cluster=cluster, confirmed=confirmed, reported_any=reported
        )
    return Outcome(
        entries=entries_of(cluster, Materials(ca=state.ca, server=issued.server, client=issued.client)),
        renewals=renewals,
        ca_data=None if ca_held and not removed else ca_data,
        tls_data=None if shapes.held_data(secrets.tls, shapes.TLS_SECRET_KEYS) == tls_data else tls_data,
        client_data=None if client_stored else client_data,
        ca_removed=removed,
        replacement=step,
        replacement_status=status,
    )


def _observations(
    seen: replacing.Seen, held: Materials, state: ReplacementState, request: replacing.Request
) -> TrustObservations:
    """``pki.replacement``'s view: the heartbeats' (``seen``), the server certificate as
    ``<name>-tls`` holds it, and whether a person confirmed the outside clients trust the new CA."""
    return TrustObservations(
        brokers=seen.brokers,
        loaded_bundles=seen.loaded_bundles,
        served_serials=seen.served(),
        server=_info(held.server),
        client=seen.client(),
        external_trust_confirmed=request.trusted is not None and request.trusted == state.token,
    )


def _issue(
    held: Materials,
    renewals: tuple[Renewal, ...],
    *,
    dns_names: tuple[str, ...],
    policy: RenewalPolicy,
    now: datetime,
    common_name: str,
) -> Materials:
    """``held`` with every renewal carried out, the CA first (plan_renewal lists it first)."""
    ca, server, client = held.ca, held.server, held.client
    for renewal in renewals:
        if renewal.target is Target.CA:
            if renewal.verb is Verb.RENEW_SAME_KEY and ca is not None:
                ca = renew_ca(ca, days=policy.ca_days, now=now)
            else:
                ca = new_ca(common_name, days=policy.ca_days, now=now)
        elif ca is None:
            raise CertificateError("no CA to issue from")  # plan_renewal always issues one first
        elif renewal.target is Target.SERVER:
            server = issue_server(ca, dns_names, days=policy.certificate_days, now=now)
        else:
            client = issue_client(ca, shapes.OPERATOR_CLIENT_NAME, days=policy.certificate_days, now=now)
    return Materials(ca=ca, server=server, client=client)


def next_check(
    entries: tuple[Entry, ...], *, policy: RenewalPolicy | None, warn_within: timedelta, now: datetime
) -> timedelta | None:
    """How long until something about ``entries`` changes on its own: a renewal falls due (with a
    ``policy``: mode Operator), a warning starts, a certificate expires. None: nothing ahead."""
    moments = []
    for entry in entries:
        if entry.info is None:
            continue
        end = entry.info.not_after
        moments += [end, end - warn_within]
        if policy is not None and entry.name in (SERVER, OPERATOR_CLIENT):
            moments.append(end - timedelta(days=policy.renew_before_days))
        elif policy is not None and entry.name == CA:
            moments.append(end - timedelta(days=policy.ca_renew_before_days))
    ahead = [moment - now for moment in moments if moment > now]
    return min(ahead) if ahead else None
