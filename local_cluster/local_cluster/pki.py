"""Certificates and kubeconfigs for a throwaway local control plane.

Why the ``openssl`` CLI: the venv has no ``cryptography`` package and this is test
infrastructure, so shelling out to the tool every machine has beats adding a
dependency. Keys are P-256 EC (fast to generate; kube-apiserver accepts ES256 for
service-account signing). Everything is valid for one year and lives in the
cluster's work directory, which is deleted with it.

The kubelet's API (``kubectl logs``, ``exec``, ``port-forward``) serves with ``kubelet.crt``
and accepts the apiserver's ``apiserver-kubelet-client.crt``.

What it does not do: no certificate rotation, no kubelet client certificate (the kubelet
authenticates to the apiserver with the admin's), no CSR signing for the controller-manager.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# ClusterIP of the `kubernetes` Service for --service-cluster-ip-range=10.96.0.0/16;
# kept in the serving certificate so in-cluster names verify even though nothing
# routes to it here.
KUBERNETES_SERVICE_IP = "10.96.0.1"
# The node's address on the pod network (netns.NODE_ADDRESS): the kubelet's InternalIP, in its
# serving certificate.
KUBELET_POD_NETWORK_IP = "10.244.0.1"


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate and its key; the subject carries the Kubernetes user and groups."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPki:
    """Every file the control plane and its clients need, all under one directory."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    service_account_key: Path
    service_account_public_key: Path
    admin: ClientCertificate
    controller_manager: ClientCertificate
    kube_proxy: ClientCertificate
    # The kubelet's API (kubectl logs, exec, port-forward): its serving certificate, and the
    # client certificate the apiserver presents to it (--kubelet-client-certificate).
    kubelet_serving_cert: Path
    kubelet_serving_key: Path
    kubelet_client: ClientCertificate


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed in {cwd}: {result.stderr.strip()}")


def _ec_key(name: str, cwd: Path) -> Path:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=cwd)
    return cwd / f"{name}.key"


def _signed_certificate(name: str, subject: str, extensions: str, cwd: Path) -> Path:
    key = _ec_key(name, cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-key", key.name, "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "365", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=cwd,
    )  # fmt: skip
    return cwd / f"{name}.crt"


def create_cluster_pki(directory: Path, extra_addresses: tuple[str, ...] = ()) -> ClusterPki:
    """Create a CA, the apiserver's serving certificate, client certificates and the SA key pair.

    ``extra_addresses`` (a cluster of several nodes: the control plane's and the nodes' addresses)
    are named in the API server's and the kubelets' serving certificates too."""
    extra_names = [f"IP:{address}" for address in extra_addresses]
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _ec_key("ca", directory)
    _openssl(
        "req", "-x509", "-new", "-key", ca_key.name, "-subj", "/CN=broker-failover-local-ca", "-days", "365",
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt", cwd=directory,
    )  # fmt: skip
    alt_names = ",".join(
        [
            "IP:127.0.0.1",
            f"IP:{KUBERNETES_SERVICE_IP}",
            f"IP:{KUBELET_POD_NETWORK_IP}",  # the API server's address on the pod network
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
            *extra_names,
        ]
    )
    serving_cert = _signed_certificate(
        "apiserver",
        "/CN=kube-apiserver",
        f"subjectAltName={alt_names}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
        directory,
    )
    client_extensions = "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n"
    # O= becomes the Kubernetes group: system:masters bypasses RBAC, as kind's admin does.
    admin_cert = _signed_certificate(
        "admin", "/O=system:masters/CN=kubernetes-admin", client_extensions, directory
    )
    # The bootstrap RBAC policy grants this exact user what the controller-manager needs.
    cm_cert = _signed_certificate(
        "controller-manager", "/CN=system:kube-controller-manager", client_extensions, directory
    )
    # The kubelet API's serving certificate: the node's InternalIP (KUBELET_POD_NETWORK_IP), as
    # the apiserver verifies it against this CA (--kubelet-certificate-authority).
    kubelet_serving_cert = _signed_certificate(
        "kubelet",
        "/CN=system:node:local-node",
        f"subjectAltName={','.join(['IP:127.0.0.1', f'IP:{KUBELET_POD_NETWORK_IP}', *extra_names])},"
        "DNS:localhost\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
        directory,
    )
    # What kubeadm names the apiserver's identity towards kubelets.
    kubelet_client_cert = _signed_certificate(
        "apiserver-kubelet-client",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        client_extensions,
        directory,
    )
    # The bootstrap RBAC policy binds system:node-proxier to this user (pod-network mode).
    kube_proxy_cert = _signed_certificate("kube-proxy", "/CN=system:kube-proxy", client_extensions, directory)
    sa_key = _ec_key("service-account", directory)
    _openssl("ec", "-in", sa_key.name, "-pubout", "-out", "service-account.pub", cwd=directory)
    return ClusterPki(
        ca_cert=directory / "ca.crt",
        ca_key=ca_key,
        serving_cert=serving_cert,
        serving_key=directory / "apiserver.key",
        service_account_key=sa_key,
        service_account_public_key=directory / "service-account.pub",
        admin=ClientCertificate(cert=admin_cert, key=directory / "admin.key"),
        controller_manager=ClientCertificate(cert=cm_cert, key=directory / "controller-manager.key"),
        kube_proxy=ClientCertificate(cert=kube_proxy_cert, key=directory / "kube-proxy.key"),
        kubelet_serving_cert=kubelet_serving_cert,
        kubelet_serving_key=directory / "kubelet.key",
        kubelet_client=ClientCertificate(
            cert=kubelet_client_cert, key=directory / "apiserver-kubelet-client.key"
        ),
    )


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_cert: Path,
    user: str,
    client: ClientCertificate | None = None,
    token: str | None = None,
) -> Path:
    """Write a single-context kubeconfig that authenticates with a client certificate or a bearer token."""
    if (client is None) == (token is None):
        raise ValueError(f"kubeconfig {path}: give exactly one of a client certificate or a bearer token")
    credentials: dict[str, Any]
    if client is not None:
        credentials = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    else:
        credentials = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
