"""RabbitMQ's TLS listener for ``bench-broker``, set up as ours is: mutual TLS from the run's one CA.

Our TLS run has the backend present a client certificate that the broker verifies (and checks
the subject of), over TLS 1.2 or 1.3, RSA-2048 from :class:`local_cluster.run_pki.LocalPki`. For
RabbitMQ the same, from the same CA:

* the node gets a serving certificate for ``127.0.0.1`` and a ``listeners.ssl`` listener with
  ``ssl_options.verify = verify_peer`` and ``fail_if_no_peer_cert = true`` (a client without a
  certificate from the CA is refused in the handshake), TLS 1.3 and 1.2, Erlang's default ciphers
  (:data:`CONFIG`);
* PerfTest connects to ``amqps://`` with the JVM's default SSL context, which it uses when it
  sees ``javax.net.ssl`` system properties (it says "TLS related system properties detected,
  using default SSL context"; without them it would trust any certificate): a PKCS#12 trust
  store holding the CA (``keytool -importcert``) and a PKCS#12 key store holding the backend's
  client certificate and key (``openssl pkcs12 -export``). The guest user still logs in with its
  password (as our backend still sends its token).

Not checked on RabbitMQ's side: the client's subject (RabbitMQ would need the
``rabbitmq_auth_mechanism_ssl`` plugin for that, and no plugin is enabled here).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from local_cluster.run_pki import LocalPki

STORE_PASSWORD = "perf-test"  # protects nothing: throwaway stores in a scratch directory

CONFIG = """\
listeners.ssl.default = {host}:{port}
ssl_options.cacertfile = {ca}
ssl_options.certfile = {cert}
ssl_options.keyfile = {key}
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
ssl_options.versions.1 = tlsv1.3
ssl_options.versions.2 = tlsv1.2
"""


@dataclass(frozen=True)
class RabbitTls:
    """The node's listener files and the JVM options PerfTest needs to connect with its certificate."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    java_options: tuple[str, ...]

    def config(self, host: str, port: int) -> str:
        """The ``rabbitmq.conf`` lines of the TLS listener on ``host:port``."""
        return CONFIG.format(host=host, port=port, ca=self.ca_file, cert=self.cert_file, key=self.key_file)


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")


def rabbit_tls(pki: LocalPki, workdir: Path) -> RabbitTls:
    """The node's certificate (``127.0.0.1``) and PerfTest's stores, under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    server = pki.ca.issue_server("rabbitmq-server", ["localhost"], ip_addresses=["127.0.0.1"])
    key_store, trust_store = workdir / "perf-test-client.p12", workdir / "perf-test-trust.p12"
    client = pki.backend_client  # the same role as our backend's: the producer's identity
    _run(
        ["openssl", "pkcs12", "-export", "-in", str(client.cert), "-inkey", str(client.key),
         "-name", "client", "-out", str(key_store), "-passout", f"pass:{STORE_PASSWORD}"],
        workdir,
    )  # fmt: skip
    trust_store.unlink(missing_ok=True)
    _run(
        ["keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", str(pki.ca.cert),
         "-keystore", str(trust_store), "-storetype", "PKCS12", "-storepass", STORE_PASSWORD],
        workdir,
    )  # fmt: skip
    java_options = (
        f"-Djavax.net.ssl.trustStore={trust_store}",
        f"-Djavax.net.ssl.trustStorePassword={STORE_PASSWORD}",
        "-Djavax.net.ssl.trustStoreType=PKCS12",
        f"-Djavax.net.ssl.keyStore={key_store}",
        f"-Djavax.net.ssl.keyStorePassword={STORE_PASSWORD}",
        "-Djavax.net.ssl.keyStoreType=PKCS12",
    )
    return RabbitTls(
        ca_file=pki.ca.cert, cert_file=server.cert, key_file=server.key, java_options=java_options
    )
