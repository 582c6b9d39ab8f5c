"""What the node agent tells the API server about its pods: status, and the kubelet's final delete.

Status goes through ``pods/status``, written only when it changed since the last write. Once
a deleted pod's processes are gone, the final delete (grace 0, uid precondition) completes
its deletion, as the kubelet's does.
"""

from __future__ import annotations

import logging

from kubernetes import client
from kubernetes.client.rest import ApiException

from local_cluster.pod_references import Body
from local_cluster.pod_runtime import PodRuntime

log = logging.getLogger("node-agent")


class PodStatusReporter:
    """Writes pod status and final deletes; remembers the last status written per pod uid."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.last_status: dict[str, Body] = {}

    def report(self, runtime: PodRuntime) -> None:
        """Write the pod's status if it changed since the last write."""
        status = runtime.status()
        if self.last_status.get(runtime.uid) == status:
            return
        metadata = runtime.pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                metadata["name"], metadata["namespace"], {"status": status}, _preload_content=False
            )
            self.last_status[runtime.uid] = status
        except ApiException as error:
            if error.status != 404:
                log.warning("status of %s/%s not written: %s", metadata["namespace"], metadata["name"], error)

    def forget(self, uid: str) -> None:
        self.last_status.pop(uid, None)

    def delete_stopped(self, runtime: PodRuntime) -> None:
        """Complete the deletion of a pod whose processes are all gone."""
        metadata = runtime.pod["metadata"]
        try:
            # The kubelet's last word: grace 0 and the uid precondition, so a new pod
            # with the same name (StatefulSet) is never deleted by mistake.
            self.core.delete_namespaced_pod(
                metadata["name"],
                metadata["namespace"],
                # In the body, not the query: the apiserver ignores query options when a body is sent.
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=runtime.uid)
                ),
                _preload_content=False,
            )
        except ApiException as error:
            if error.status not in (404, 409):
                log.warning("final delete of %s failed: %s", metadata["name"], error.reason)
