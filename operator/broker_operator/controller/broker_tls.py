"""The TLS parts of a broker pod, from ``spec.tls``: volumes, mounts, environment, probe scheme.

The broker serves TLS on both of its ports when ``BROKER_TLS_DIR`` names a directory holding
``tls.crt``, ``tls.key`` and ``ca.crt`` (``broker_contracts.tls.layout``; docs/broker.md, "TLS"),
and then requires its admin port, which every pod the operator makes has. Each Secret is a
volume mounted whole at a fixed path, never with ``subPath``: the kubelet swaps a Secret volume's
files in one atomic rename when the Secret changes, and the broker re-reads them
(``--tls-reload-seconds``), so a certificate rotation reaches a running broker with no restart,
while a ``subPath`` mount would keep the first version forever. For the same reason nothing of a
Secret's content (a serial, a checksum) is put into the pod: the pod template, and with it the
template hash that decides when pods are replaced (``builders.template_hash``), names the Secrets
only, so a rotation never replaces a pod; a change of mode, of a Secret's name or of the trusted
subjects does, one pod at a time like any template change.

- mode Operator: ``<name>-tls``, which the operator writes from the cluster's CA;
- mode Secrets: a projected volume of the user's two Secrets, ``tls.crt`` and ``tls.key`` from
  ``secrets.server`` and ``ca.crt`` (the CA of the operator's client certificate, which the admin
  port trusts) from ``secrets.operatorClient``. The kubelet writes a projected volume's sources in
  one swap too.
- ``backendClients``: its CA key as ``ca.crt`` in a directory of its own
  (``BROKER_CLIENT_CA_FILE``) and the subjects one per line (``BROKER_ALLOWED_CLIENT_SUBJECTS``);
- ``upstreamCASecretRef``: the same for ``BROKER_UPSTREAM_CA_FILE``, whatever the mode (it is the
  brokers' trust as clients of ``https://`` URLs, not what they serve).

A Secret that does not exist keeps the pod in ContainerCreating (the kubelet's ``FailedMount``
event names it), and condition ``Ready`` says so (``BrokerPodsNotRunning``): the right signal, as
a broker that started without its certificate could only refuse every call. A Secret the user
names is also checked before any pod is made (``credentials.named_secrets``).

The probes use ``scheme: HTTPS`` on the main port when it serves TLS. The kubelet does not verify
the certificate (it has no CA to verify it against and does not try), which is fine: a probe
asks "is this process up", not "is this the broker". With ``backendClients`` the main port asks
for a client certificate but lets a caller without one reach the endpoints that need none,
``/readyz`` and ``/healthz`` among them, so the kubelet presents none and needs none.

What it does not do: issue or read certificates.
"""

from __future__ import annotations

from typing import Any, Final

from broker_contracts import environment
from broker_contracts.tls.layout import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from broker_operator.controller import names
from broker_operator.controller.secret_refs import SecretRef
from broker_operator.controller.tls_spec import TlsSpec

Manifest = dict[str, Any]

HTTPS: Final = "HTTPS"
_SERVED_FILES: Final = (TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE)


def _items(*keys: tuple[str, str]) -> list[Manifest]:
    return [{"key": key, "path": path} for key, path in keys]


def _served_volume(cluster: str, tls: TlsSpec) -> Manifest:
    """The volume of the brokers' TLS directory for ``tls.mode`` (Operator or Secrets)."""
    if tls.secrets is None:  # mode Operator
        items = _items(*((name, name) for name in _SERVED_FILES))
        return {
            "name": names.TLS_VOLUME,
            "secret": {"secretName": names.tls_secret_name(cluster), "items": items},
        }
    server = {
        "name": tls.secrets.server,
        "items": _items((TLS_CERT_FILE, TLS_CERT_FILE), (TLS_KEY_FILE, TLS_KEY_FILE)),
    }
    client_ca = {"name": tls.secrets.operator_client, "items": _items((TLS_CA_FILE, TLS_CA_FILE))}
    return {"name": names.TLS_VOLUME, "projected": {"sources": [{"secret": server}, {"secret": client_ca}]}}


def _bundle_volume(volume: str, ref: SecretRef) -> Manifest:
    """A CA bundle Secret key as the file ``ca.crt`` (whatever its key), alone in its volume."""
    return {
        "name": volume,
        "secret": {"secretName": ref.name, "items": _items((ref.key, names.CA_BUNDLE_FILE))},
    }


def _bundles(tls: TlsSpec, *, serving: bool) -> list[tuple[str, str, SecretRef]]:
    """(volume, mount path, Secret key) of each CA bundle the pod gets."""
    bundles = []
    if serving and tls.backend_clients is not None:
        bundles.append(
            (names.BACKEND_CLIENTS_CA_VOLUME, names.BACKEND_CLIENTS_CA_MOUNT, tls.backend_clients.ca)
        )
    if tls.upstream_ca is not None:
        bundles.append((names.UPSTREAM_CA_VOLUME, names.UPSTREAM_CA_MOUNT, tls.upstream_ca))
    return bundles


def tls_volumes(cluster: str, tls: TlsSpec, *, serving: bool) -> list[Manifest]:
    """The pod's TLS volumes; ``serving``: whether the brokers serve TLS (``builders.serves_tls``)."""
    volumes = [_served_volume(cluster, tls)] if serving else []
    return volumes + [_bundle_volume(volume, ref) for volume, _mount, ref in _bundles(tls, serving=serving)]


def tls_mounts(tls: TlsSpec, *, serving: bool) -> list[Manifest]:
    """The broker container's read-only mounts of :func:`tls_volumes`."""
    mounts = [{"name": names.TLS_VOLUME, "mountPath": names.TLS_MOUNT, "readOnly": True}] if serving else []
    return mounts + [
        {"name": volume, "mountPath": mount, "readOnly": True}
        for volume, mount, _ref in _bundles(tls, serving=serving)
    ]


def tls_env(tls: TlsSpec, *, serving: bool) -> list[Manifest]:
    """The broker's TLS settings (docs/broker.md, "Settings")."""
    env: list[Manifest] = []
    if serving:
        env.append({"name": environment.BROKER_TLS_DIR, "value": names.TLS_MOUNT})
        if tls.backend_clients is not None:
            ca_file = f"{names.BACKEND_CLIENTS_CA_MOUNT}/{names.CA_BUNDLE_FILE}"
            env.append({"name": environment.BROKER_CLIENT_CA_FILE, "value": ca_file})
            subjects = "\n".join(tls.backend_clients.allowed_subjects)
            env.append({"name": environment.BROKER_ALLOWED_CLIENT_SUBJECTS, "value": subjects})
    if tls.upstream_ca is not None:
        ca_file = f"{names.UPSTREAM_CA_MOUNT}/{names.CA_BUNDLE_FILE}"
        env.append({"name": environment.BROKER_UPSTREAM_CA_FILE, "value": ca_file})
    return env


def probe_scheme(*, serving: bool) -> dict[str, str]:
    """The ``httpGet`` fields that make a probe speak TLS to a serving broker (none for plain HTTP,
    so that a plain pod's template, and hash, stay as they were)."""
    return {"scheme": HTTPS} if serving else {}
