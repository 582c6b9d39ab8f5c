"""The certificates controller's pass against an in-memory Secret store, shared by the unit tests
of ``ensure_certificates`` (``test_certificates_shell``, ``test_ca_replacement_shell``,
``test_heartbeat_tls``) and the integration test of the CA key replacement: the store keeps
resourceVersions and answers 409 as the API server does; ``reconcile`` runs one pass and applies
its status patch as kopf would. The ``events`` fixture (kopf's posting, recorded) is in this
package's conftest."""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime
from typing import Any

from broker_operator.controller import names
from broker_operator.controller.certificates import ensure_certificates
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.reconcile import ClusterRef
from broker_operator.controller.settings import ControllerSettings
from broker_operator.controller.spec import ClusterSpec, parse_spec

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
UID = "uid-orders"
LOG = logging.getLogger(__name__)


class SecretStore:
    """The Secret calls of ``KubeApi`` the certificates make, over a dict, with resourceVersions."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.reads = 0
        self.version = 0
        self.before_create: Any = None  # called before a create lands: another replica's turn

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        return body

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        found = self.secrets.get(name)
        return copy.deepcopy(found) if found is not None else None

    async def create(self, manifest: dict[str, Any]) -> bool:
        if self.before_create is not None:
            hook, self.before_create = self.before_create, None
            await hook()
        name = manifest["metadata"]["name"]
        self.writes.append(("create", name))
        if name in self.secrets:
            return False
        self.secrets[name] = self._stored(manifest)
        return True

    async def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        self.writes.append(("patch", name))
        current = self.secrets.get(name)
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if current is None or (wanted and wanted != current["metadata"]["resourceVersion"]):
            return False
        merged = copy.deepcopy(current)
        for key, value in (patch.get("data") or {}).items():  # a merge patch: null deletes the key
            if value is None:
                merged["data"].pop(key, None)
            else:
                merged["data"][key] = value
        merged["metadata"]["labels"].update(patch.get("metadata", {}).get("labels") or {})
        self.secrets[name] = self._stored(merged)
        return True


def body(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": names.KIND,
        "metadata": {"name": "orders", "namespace": "shop", "uid": UID, "generation": 1},
        "spec": {"account": "acme", "company": "1000", "replicas": 2, **spec},
        "status": status or {},
    }


def context_for(store: SecretStore) -> ControllerContext:
    return ControllerContext(settings=ControllerSettings(broker_tls=True), api=store)  # type: ignore[arg-type]


async def reconcile(
    context: ControllerContext, manifest: dict[str, Any], now: datetime = NOW
) -> tuple[dict[str, Any], bool]:
    """One pass; the status patch, applied to ``manifest`` as kopf would, and whether pods are held."""
    spec: ClusterSpec = parse_spec("orders", manifest["spec"])
    ref = ClusterRef("shop", "orders", manifest, manifest["status"])
    patch: dict[str, Any] = {}
    held = await ensure_certificates(context, ref, spec, patch, LOG, now=now)
    for key, value in patch.items():
        if value is None:
            manifest["status"].pop(key, None)
        elif key == "tls":  # a merge patch: what it names, null removes
            tls = manifest["status"].setdefault("tls", {})
            for field, part in value.items():
                if part is None:
                    tls.pop(field, None)
                else:
                    tls[field] = part
        else:
            manifest["status"][key] = value
    return patch, held


def expire_cache(context: ControllerContext) -> None:
    for check in context.certificate_checks.values():
        check.due = 0.0


def condition(manifest: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in manifest["status"]["conditions"] if c["type"] == "CertificatesValid")


SECRETS = 3  # <name>-ca, <name>-tls, <name>-operator-client: what each pass that reads, reads
