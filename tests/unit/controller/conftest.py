"""A kmock Kubernetes API and the controller's kopf handlers running against it, in-process.

kmock stands in for the API server here: a real one comes with the e2e tests
(tests/e2e/test_operator.py), and these tests check what the controller asks
of the API, not what a kubelet or admission would do with it. Nothing of our
own is mocked: the handlers, the shell and the engine are the real ones.

The emulator is extended in one way the real API server behaves and kmock does
not: objects created with ``generateName`` (kopf's Events) get a unique name.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp.web
import attrs
import kmock
import kopf
import kubernetes
import pytest

from broker_operator.controller import names
from broker_operator.controller.context import MEMO_KEY, ControllerContext
from broker_operator.controller.handlers import configure_kopf, register_handlers
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.settings import ControllerSettings
from broker_simulators.local_processes import free_port

NAMESPACE = "erp"
CLUSTERS = f"{names.GROUP}/{names.VERSION}/{names.PLURAL}"
RECONCILE_SECONDS = 2.0
VERBS = {"list", "watch", "get", "create", "patch", "update", "delete"}


@attrs.define(kw_only=True)
class NamingEmulator(kmock.KubernetesEmulator):
    """A ``KubernetesEmulator`` that names objects created with ``generateName``, as the API server does."""

    _serial: Any = attrs.field(factory=itertools.count, init=False)
    # Every write request (method, path) in arrival order, for the tests that count API writes.
    writes: list[tuple[str, str]] = attrs.field(factory=list, init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.method in {"POST", "PUT", "PATCH", "DELETE"}:
            self.writes.append((request.method, str(request.url.path)))
        data = request.data
        if request.method == "POST" and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{next(self._serial)}"
        return await super()._handle(request)


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return {**kmock_options, "cls": NamingEmulator}


def declare_resources(api: kmock.KubernetesEmulator) -> None:
    api.resources[CLUSTERS] = kmock.ResourceInfo(
        kind=names.KIND, namespaced=True, subresources={"status"}, verbs=VERBS, shortnames={"bc"}
    )
    for plural, kind in [
        ("pods", "Pod"),
        ("services", "Service"),
        ("persistentvolumeclaims", "PersistentVolumeClaim"),
        ("secrets", "Secret"),
        ("events", "Event"),
    ]:
        api.resources[f"v1/{plural}"] = kmock.ResourceInfo(kind=kind, namespaced=True, verbs=VERBS)
    api.resources["networking.k8s.io/v1/networkpolicies"] = kmock.ResourceInfo(
        kind="NetworkPolicy", namespaced=True, verbs=VERBS
    )
    api.resources["discovery.k8s.io/v1/endpointslices"] = kmock.ResourceInfo(
        kind="EndpointSlice", namespaced=True, verbs=VERBS
    )
    # kopf's backbone: it waits for these to be discoverable before it starts any watch.
    api.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=VERBS)
    api.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs=VERBS
    )


@pytest.fixture
def kube_api(kmock: kmock.KubernetesEmulator) -> KubeApi:
    declare_resources(kmock)
    return KubeApi(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kmock.url))))


@contextlib.asynccontextmanager
async def running_operator(
    api: kmock.KubernetesEmulator, kube_api: KubeApi, **settings_given: Any
) -> AsyncIterator[ControllerContext]:
    """The controller's handlers in a kopf operator task against kmock, stopped on exit.

    A context manager entered inside the test rather than a fixture: when kopf
    stops, it cancels every task created while it ran, and a fixture's teardown
    runs in such a task; the test's own task predates the operator and is spared.
    """
    registry = kopf.OperatorRegistry()
    register_handlers(registry, reconcile_seconds=RECONCILE_SECONDS)

    @kopf.on.login(registry=registry)
    def login_to_kmock(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(api.url))

    settings = kopf.OperatorSettings()
    configure_kopf(settings)
    settings.scanning.disabled = True  # kmock serves the resources it was told about; nothing to discover
    context = ControllerContext(
        settings=ControllerSettings(
            **{
                "namespaces": (NAMESPACE,),
                "operator_id": "unit-test",
                "daemon_poll_seconds": 0.5,
                **settings_given,
            }
        ),
        api=kube_api,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=settings,
            namespaces=list(context.settings.namespaces),  # NAMESPACE unless a test names more
            standalone=True,
            memo=kopf.Memo({MEMO_KEY: context}),
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    await asyncio.wait_for(ready.wait(), timeout=30)
    try:
        yield context
    finally:
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=30)
        if not done:
            task.cancel()
        assert task in done, "kopf did not stop within 30 s of the stop flag"
        error = None if task.cancelled() else task.exception()
        # kopf cancels every task created while it ran, the emulator's aiohttp request handlers
        # too, and re-raises what they raised: a handler cancelled mid-request may end in
        # TimeoutError (seen once in CI: RequestHandler.start, at the stop). That is the stand-in
        # server's, not the operator's: kopf catches what the operator's handlers raise.
        if error is not None and not isinstance(error, TimeoutError):
            raise error


def cluster_body(name: str, *, created: str = "2026-11-22T10:00:00Z", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": {"account": "acme", "company": "1000", **spec},
    }


def objects_of(api: kmock.KubernetesEmulator, resource: str) -> dict[str, dict[str, Any]]:
    """Live (not deleted) objects of one resource in the test namespace, by name, as plain dicts."""
    found: dict[str, dict[str, Any]] = {}
    for (res, namespace, name), obj in api.objects.items():
        if res == kmock.resource(resource) and namespace == NAMESPACE and not obj.deleted:
            found[name] = dict(obj.raw)
    return found


def events_of(api: kmock.KubernetesEmulator, about: str) -> list[dict[str, Any]]:
    return [
        e for e in objects_of(api, "v1/events").values() if e.get("involvedObject", {}).get("name") == about
    ]


async def eventually(check: Callable[[], bool], *, attempts: int = 200, step: float = 0.1) -> None:
    """Wait, in bounded steps of loop time, until ``check()`` holds; fail with the last state if not."""
    for _ in range(attempts):
        if check():
            return
        await asyncio.sleep(step)
    assert check(), "condition never held"


BrokerHandler = Callable[[aiohttp.web.Request], Awaitable[aiohttp.web.Response]]


async def serve_brokers(heartbeat: BrokerHandler) -> tuple[aiohttp.web.AppRunner, int]:
    """A loopback server answering ``POST /{cluster}/{broker}/soap`` (endpoints-mode broker URLs) with
    ``heartbeat``; the caller cleans the runner up."""
    app = aiohttp.web.Application()
    app.router.add_post("/{cluster}/{broker}/soap", heartbeat)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """The events the code posts through ``kopf.info`` and ``kopf.warn``, as (type, reason, message)."""
    posted: list[tuple[str, str, str]] = []
    for name, kind in (("info", "Normal"), ("warn", "Warning")):
        monkeypatch.setattr(
            kopf, name, lambda body, *, reason, message, k=kind: posted.append((k, reason, message))
        )
    return posted
