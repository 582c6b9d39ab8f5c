"""The controller's few Kubernetes calls, made with the official client off the event loop.

kopf watches and patches the BrokerClusters it hands to handlers; everything
else (children, pod labels, the conditional epoch write, Secrets) goes through
the ``kubernetes`` client, which is synchronous, so each call runs in a thread
(asyncio's worker threads, or an executor of the instance's own) and never blocks the
heartbeat loops sharing the event loop. One ``ApiClient`` per operator, made once at startup.

Two instances share it: ``ControllerContext.api`` for the reconciles and
``ControllerContext.engine_api`` (its own threads, ``lane``) for what failover and renewals wait on:
the token read before a daemon's first heartbeat, epochs, status, the role label and the
``-active`` slice. Threads are taken first come, first served, so on one pool the 4,000 creates
and deletes of 1,000 clusters' reconciles after an operator restart kept every daemon's token
read waiting for 19 s, past every broker's lease (docs/benchmarks.md).

Label selectors are sent to the API server and also re-checked here on the
result: the selection is what keeps one cluster's label moves away from
another cluster's pods, so it must not depend on the server honouring the
selector. This module knows API shapes, not failover.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import functools
import json
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from broker_operator import metrics
from broker_operator.controller import names
from broker_operator.controller.bodies import BrokerClusterBody, OwnerReference, PodBody
from broker_operator.controller.peering import PeeringConflict

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
EVENT_MESSAGE_LIMIT = 1024
T = TypeVar("T")


class KubeApi:
    """Async wrappers over the calls the controller needs; ``ApiException`` passes through."""

    def __init__(self, api_client: kubernetes.client.ApiClient, executor: Executor | None = None) -> None:
        self._executor = executor  # None: asyncio's worker threads
        self._client = api_client
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        self._networking = kubernetes.client.NetworkingV1Api(api_client)
        self._discovery = kubernetes.client.DiscoveryV1Api(api_client)
        self._policy = kubernetes.client.PolicyV1Api(api_client)
        self._storage = kubernetes.client.StorageV1Api(api_client)
        self._extensions = kubernetes.client.ApiextensionsV1Api(api_client)

    def lane(self, threads: int, name: str) -> KubeApi:
        """The same client with ``threads`` threads of its own, so that its calls never queue behind
        this instance's."""
        return KubeApi(self._client, ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name))

    async def _thread(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # run_in_executor(None, ...) is asyncio's default executor, the one asyncio.to_thread uses.
        with metrics.kube_request(call, args):  # counted by verb and code (the dashboard's API requests)
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, functools.partial(call, *args, **kwargs)
            )

    async def read_cluster(self, namespace: str, name: str) -> BrokerClusterBody:
        body = await self._thread(
            self._custom.get_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            namespace,
            names.PLURAL,
            name,
        )
        return cast(BrokerClusterBody, body)

    async def patch_cluster_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch the status subresource; ``metadata.resourceVersion`` in ``patch`` is a precondition."""
        await self._thread(
            self._custom.patch_namespaced_custom_object_status,
            names.GROUP,
            names.VERSION,
            namespace,
            names.PLURAL,
            name,
            dict(patch),
        )

    async def create_event(
        self, involved: Mapping[str, str], reason: str, message: str, warning: bool, instance: str
    ) -> None:
        """A core/v1 Event about ``involved`` (an object reference with its namespace and uid), as
        ``kubectl describe`` shows them; ``instance``: which replica of the operator."""
        if len(message) > EVENT_MESSAGE_LIMIT:  # the API server's limit for the events.k8s.io view
            half = EVENT_MESSAGE_LIMIT // 2 - 2
            message = f"{message[:half]}...{message[-half:]}"
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"]},
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": names.EVENT_COMPONENT},  # the "From" of `kubectl describe`
            "reportingComponent": names.EVENT_COMPONENT,
            "reportingInstance": instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._thread(self._core.create_namespaced_event, involved["namespace"], body)

    async def read_peering(self, name: str, namespace: str | None) -> Mapping[str, Any] | None:
        """kopf's peering object ``name``, or None (listed by name: the chart grants list, not get)."""
        selector = f"metadata.name={name}"
        if namespace is None:
            result = await self._thread(
                self._custom.list_cluster_custom_object,
                names.KOPF_GROUP,
                names.KOPF_VERSION,
                names.CLUSTER_PEERINGS,
                field_selector=selector,
            )
        else:
            result = await self._thread(
                self._custom.list_namespaced_custom_object,
                names.KOPF_GROUP,
                names.KOPF_VERSION,
                namespace,
                names.PEERINGS,
                field_selector=selector,
            )
        items = cast(Mapping[str, Any], result).get("items") or []
        return cast(Mapping[str, Any], items[0]) if items else None

    async def read_crd_metadata(self, name: str) -> Mapping[str, Any] | None:
        """The metadata of the CustomResourceDefinition ``name``, or None: listed by name (the chart
        grants kopf's list, not get), as metadata alone (the BrokerCluster CRD is 60 kB of schema)."""
        listing = await self._thread(
            _raw_json,
            self._extensions.list_custom_resource_definition,
            field_selector=f"metadata.name={name}",
            _headers={"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"},
        )
        items = listing.get("items") or []
        # The selector is checked here too: an API server that ignores it returns every CRD.
        found = [item for item in items if (item.get("metadata") or {}).get("name") == name]
        return cast(Mapping[str, Any], found[0]["metadata"]) if found else None

    async def write_peer(
        self,
        name: str,
        namespace: str | None,
        identity: str,
        record: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> None:
        """Merge this replica's record into the peering object's status, as kopf's keep-alive does;
        with ``resource_version``, only if the object is still at it (else ``PeeringConflict``)."""
        patch: dict[str, Any] = {"status": {identity: dict(record)}}
        if resource_version is not None:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            if namespace is None:
                await self._thread(
                    self._custom.patch_cluster_custom_object,
                    names.KOPF_GROUP,
                    names.KOPF_VERSION,
                    names.CLUSTER_PEERINGS,
                    name,
                    patch,
                )
            else:
                await self._thread(
                    self._custom.patch_namespaced_custom_object,
                    names.KOPF_GROUP,
                    names.KOPF_VERSION,
                    namespace,
                    names.PEERINGS,
                    name,
                    patch,
                )
        except ApiException as error:
            if error.status == HTTP_CONFLICT and resource_version is not None:
                raise PeeringConflict(f"{name} changed since resourceVersion {resource_version}") from error
            raise

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create a core/v1 object, NetworkPolicy, EndpointSlice or PodDisruptionBudget unless it exists;
        True if created now."""
        namespace = manifest["metadata"]["namespace"]
        creators: dict[str, Callable[..., object]] = {
            "Pod": self._core.create_namespaced_pod,
            "PersistentVolumeClaim": self._core.create_namespaced_persistent_volume_claim,
            "Service": self._core.create_namespaced_service,
            "Secret": self._core.create_namespaced_secret,
            "NetworkPolicy": self._networking.create_namespaced_network_policy,
            "EndpointSlice": self._discovery.create_namespaced_endpoint_slice,
            "PodDisruptionBudget": self._policy.create_namespaced_pod_disruption_budget,
        }
        create = creators[manifest["kind"]]
        try:
            await self._thread(create, namespace, dict(manifest))
        except ApiException as error:
            if error.status == HTTP_CONFLICT:  # already there: creation is idempotent
                return False
            raise
        return True

    async def update_network_policy(self, manifest: Mapping[str, Any]) -> None:
        """Bring an existing NetworkPolicy's spec and labels to ``manifest``'s (a merge patch: the
        lists inside ``spec`` are replaced whole, so a peer removed from the spec is removed)."""
        metadata = manifest["metadata"]
        patch = {"metadata": {"labels": metadata["labels"]}, "spec": manifest["spec"]}
        await self._thread(
            self._networking.patch_namespaced_network_policy,
            metadata["name"],
            metadata["namespace"],
            patch,
            _content_type="application/merge-patch+json",
        )

    async def set_min_available(self, namespace: str, name: str, min_available: int) -> None:
        """Set a PodDisruptionBudget's ``spec.minAvailable``."""
        await self._thread(
            self._policy.patch_namespaced_pod_disruption_budget,
            name,
            namespace,
            {"spec": {"minAvailable": min_available}},
            _content_type="application/merge-patch+json",
        )

    async def delete_network_policy(self, namespace: str, name: str) -> bool:
        """Delete NetworkPolicy ``name``; False if there was none."""
        try:
            await self._thread(self._networking.delete_namespaced_network_policy, name, namespace)
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return False
            raise
        return True

    async def list_cluster_pods(self, namespace: str, cluster: str) -> list[PodBody]:
        selector = f"{names.LABEL_CLUSTER}={cluster},{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
        result = await self._thread(
            _raw_json, self._core.list_namespaced_pod, namespace, label_selector=selector
        )
        items = result.get("items") or []
        return [
            cast(PodBody, pod)
            for pod in items
            if (pod.get("metadata", {}).get("labels") or {}).get(names.LABEL_CLUSTER) == cluster
        ]

    async def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        """The nodes with these labels (the default zone spread lists the zoned ones at start)."""
        result = await self._thread(_raw_json, self._core.list_node, label_selector=label_selector)
        return list(result.get("items") or [])

    async def set_pod_role(self, namespace: str, pod: str, role: str) -> None:
        patch = {"metadata": {"labels": {names.LABEL_ROLE: role}}}
        try:
            await self._thread(self._core.patch_namespaced_pod, pod, namespace, patch)
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:  # a pod that is gone carries no label to move
                raise

    async def delete_pod(self, namespace: str, pod: str) -> None:
        try:
            await self._thread(self._core.delete_namespaced_pod, pod, namespace)
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:
                raise

    async def pod_exists(self, namespace: str, pod: str) -> bool:
        """Whether the API server (not a watch that may lag behind it) still has pod ``pod``."""
        try:
            await self._thread(_raw_json, self._core.read_namespaced_pod, pod, namespace)
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return False
            raise
        return True

    async def delete_claim(self, namespace: str, claim: str, uid: str | None) -> None:
        """Delete PVC ``claim`` if it is still the object ``uid`` (not one created since under its name)."""
        preconditions = kubernetes.client.V1Preconditions(uid=uid) if uid else None
        options = kubernetes.client.V1DeleteOptions(preconditions=preconditions)
        try:
            await self._thread(
                self._core.delete_namespaced_persistent_volume_claim, claim, namespace, body=options
            )
        except ApiException as error:
            # Gone already, or replaced by a claim the decision was not about: nothing to delete.
            if error.status not in {HTTP_NOT_FOUND, HTTP_CONFLICT}:
                raise

    async def set_claim_owners(
        self, namespace: str, claim: str, owners: list[OwnerReference], resource_version: str | None
    ) -> bool:
        """Replace the claim's owner references, conditional on ``resource_version``; False on a conflict."""
        metadata: dict[str, Any] = {"ownerReferences": owners}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        try:
            # A merge patch replaces the list; a strategic merge (the client's default) would merge
            # by uid and could never take a reference away.
            await self._thread(
                self._core.patch_namespaced_persistent_volume_claim,
                claim,
                namespace,
                {"metadata": metadata},
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status in {HTTP_NOT_FOUND, HTTP_CONFLICT}:  # the watch brings the newer body
                return False
            raise
        return True

    async def resize_claim(self, namespace: str, claim: str, size: str, resource_version: str | None) -> bool:
        """Ask for ``size`` on the claim (``spec.resources.requests.storage``), conditional on
        ``resource_version``; False on a conflict or a claim gone (the watch brings the newer body)."""
        patch: dict[str, Any] = {"spec": {"resources": {"requests": {"storage": size}}}}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            await self._thread(
                self._core.patch_namespaced_persistent_volume_claim,
                claim,
                namespace,
                patch,
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status in {HTTP_NOT_FOUND, HTTP_CONFLICT}:
                return False
            raise
        return True

    async def read_storage_class(self, name: str) -> dict[str, Any] | None:
        """StorageClass ``name`` (cluster-scoped), or None when there is none of that name."""
        try:
            return await self._thread(_raw_json, self._storage.read_storage_class, name)
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise

    async def read_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._thread(_raw_json, self._core.read_namespaced_service, name, namespace)
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise

    async def patch_service(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch Service ``name``: a null removes a field or key, a list is replaced whole."""
        await self._thread(
            self._core.patch_namespaced_service,
            name,
            namespace,
            dict(patch),
            _content_type="application/merge-patch+json",
        )

    async def remove_service_selector(self, namespace: str, name: str, resource_version: str) -> None:
        """Drop the Service's selector (a merge patch, conditional on ``resource_version``)."""
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": {"selector": None}}
        await self._thread(
            self._core.patch_namespaced_service,
            name,
            namespace,
            patch,
            _content_type="application/merge-patch+json",
        )

    async def delete_endpoints(self, namespace: str, name: str) -> None:
        try:
            await self._thread(self._core.delete_namespaced_endpoints, name, namespace)
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:
                raise

    async def read_endpoint_slice(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._thread(
                _raw_json, self._discovery.read_namespaced_endpoint_slice, name, namespace
            )
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise

    async def replace_endpoint_slice(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """PUT ``body`` (which carries the read ``resourceVersion``); the slice as stored, or None if
        it changed or went meanwhile."""
        try:
            replace: Callable[..., object] = self._discovery.replace_namespaced_endpoint_slice
            return await self._thread(_raw_json, replace, name, namespace, dict(body))
        except ApiException as error:
            if error.status in {HTTP_NOT_FOUND, HTTP_CONFLICT}:
                return None
            raise

    async def list_endpoint_slices(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = await self._thread(
            _raw_json,
            self._discovery.list_namespaced_endpoint_slice,
            namespace,
            label_selector=label_selector,
        )
        return list(result.get("items") or [])

    async def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        try:
            await self._thread(self._discovery.delete_namespaced_endpoint_slice, name, namespace)
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:
                raise

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Secret ``name`` as the API server returns it; None if it does not exist. Whether it may be
        used is ``credentials.py``'s question, asked before any value is decoded."""
        try:
            return await self._thread(_raw_json, self._core.read_namespaced_secret, name, namespace)
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """The decoded value of ``key`` in Secret ``name``; None if the Secret or key is absent."""
        secret = await self.read_secret(namespace, name)
        return None if secret is None else secret_value(secret, key)

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """Every key of Secret ``name``, decoded; None if it is absent. For Secrets that hold no
        credential (the brokers' verifiers)."""
        try:
            secret = await self._thread(_raw_json, self._core.read_namespaced_secret, name, namespace)
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise
        data = {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}
        return {**data, **{key: str(value) for key, value in (secret.get("stringData") or {}).items()}}

    async def patch_secret_data(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Set ``data``'s keys in Secret ``name`` (a merge patch of ``data``; other keys stay)."""
        encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
        await self._thread(
            self._core.patch_namespaced_secret,
            name,
            namespace,
            {"data": encoded},
            _content_type="application/merge-patch+json",
        )

    async def patch_secret(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """Merge-patch Secret ``name``; with ``metadata.resourceVersion`` in ``patch``, only if it is
        still at that version. False if it changed (409) or went (404) meanwhile: read it again."""
        try:
            await self._thread(
                self._core.patch_namespaced_secret,
                name,
                namespace,
                dict(patch),
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status in {HTTP_NOT_FOUND, HTTP_CONFLICT}:
                return False
            raise
        return True


def secret_value(secret: Mapping[str, Any], key: str) -> str | None:
    """The decoded value of ``key`` in a Secret body; None if the key is absent."""
    if key in (secret.get("data") or {}):
        return base64.b64decode(secret["data"][key]).decode()
    # stringData is write-only on a real API server; simpler API servers may echo it back.
    value = (secret.get("stringData") or {}).get(key)
    return str(value) if value is not None else None


def _raw_json(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``call`` raw (``_preload_content=False``) and its body decoded: plain dicts, not the client's
    model objects. Run in the worker thread, so the body is read there and never on the event loop,
    and reading it to the end returns the connection to the pool (an unread raw response holds it
    until the response is collected)."""
    response = call(*args, _preload_content=False, **kwargs)
    return cast(dict[str, Any], json.loads(response.data))
