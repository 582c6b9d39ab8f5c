"""The heartbeat client's TLS for one BrokerCluster: its first material, and each rotation after.

The certificates controller (``certificates.py``) looks at a cluster's Secrets on its own cadence
(once per spec generation, when something falls due, every ``certificates_recheck_seconds``) and
records each look in ``context.certificate_checks``. This follows it: the engine's client
material (``client_tls.read_client_material``: the operator's client certificate and the CA
bundle the brokers' certificates chain to) is read once at start and again only after a newer
look, so a renewed certificate or a CA bundle that gained or lost a CA reaches the heartbeats
within one poll of the controller writing it, at one Secret read per look, not per heartbeat.

Start: with ``spec.tls`` on and the brokers serving TLS (``ControllerSettings.broker_tls``; pods
mode), the engine does not start without material: it could only fail every heartbeat with a TLS
error. ``waiting_reason`` says why in the daemon's "heartbeats wait for" line. A material that
does not load keeps the context in use (``TlsClient.update``) and is logged once per version.

What it does not do: issue or check certificates (the controller does, and reports them in
condition ``CertificatesValid``), or build contexts (``tls_client.py``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker_operator.controller.certificate_report import SERVER, CertificateReport
from broker_operator.controller.client_tls import read_client_material
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.spec import ClusterSpec
from broker_operator.heartbeat_client import HeartbeatClient
from broker_operator.tls_client import TlsClient, TlsMaterialError
from broker_operator.tls_material import ClientTlsMaterial

logger = logging.getLogger(__name__)


def serving_serial(report: CertificateReport | None) -> str | None:
    """The serial of the brokers' serving certificate in the controller's last look, if it read one."""
    for entry in report.entries if report is not None else ():
        if entry.name == SERVER and entry.info is not None:
            return entry.info.serial
    return None


def material_required(context: ControllerContext, spec: ClusterSpec) -> bool:
    """Whether the engine must have client material before it starts: the pods serve TLS."""
    return spec.tls.enabled and context.settings.broker_tls and not spec.endpoints_mode


@dataclass
class HeartbeatTls:
    """Follows one cluster's client material for its heartbeat client."""

    context: ControllerContext
    namespace: str
    cluster: str
    read_at: float = field(default=float("-inf"))  # monotonic: when the material was last read
    problem: str | None = None  # why there is no material (the last read's reason)
    material: ClientTlsMaterial | None = field(default=None, repr=False)  # the last read's
    _built: TlsClient | None = field(default=None, repr=False)  # client()'s, for its material

    async def read(self, spec: ClusterSpec) -> ClientTlsMaterial | None:
        self.read_at = time.monotonic()
        if not spec.tls.enabled:
            self.problem, self.material = "spec.tls.mode is Disabled", None
            return None
        found = await read_client_material(self.context.engine_api, self.namespace, self.cluster, spec.tls)
        self.problem, self.material = found.reason, found.material
        return found.material

    def client(self) -> TlsClient | None:
        """A ``TlsClient`` of the last material read (None without one, or if it does not load);
        built once per material version: the start check and the engine ask for the same one."""
        if self.material is None:
            return None
        if self._built is not None and self._built.version == self.material.version:
            return self._built
        try:
            self._built = TlsClient(self.material)
            return self._built
        except TlsMaterialError as error:
            self.problem = f"the client TLS material does not load: {error}"
            logger.warning("%s/%s: %s", self.namespace, self.cluster, self.problem)
            return None

    def due(self) -> bool:
        """Whether the controller looked at the Secrets since the material was last read."""
        check = self.context.certificate_checks.get((self.namespace, self.cluster))
        return check is not None and check.read_from > self.read_at

    async def follow(self, spec: Callable[[], ClusterSpec], heartbeats: HeartbeatClient) -> None:
        """After a newer look by the controller: hand a changed material to the heartbeat client
        (``spec`` is called only then: parsing a spec every poll costs at thousands of clusters)."""
        check = self.context.certificate_checks.get((self.namespace, self.cluster))
        if heartbeats.tls is not None and check is not None:
            heartbeats.tls.expect_serving(serving_serial(check.report))
        if not self.due():
            return
        material = await self.read(spec())
        if material is None:
            return  # the controller's condition says why; the heartbeats keep what they have
        if heartbeats.tls is None:
            heartbeats.use_tls(self.client())
            return
        with contextlib.suppress(TlsMaterialError):  # logged once per version; the context in use stays
            heartbeats.tls.update(material)
