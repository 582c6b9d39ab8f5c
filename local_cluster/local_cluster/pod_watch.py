"""The node agent's view of pods: list, then watch, relisting after errors, into a queue.

It runs on a thread of its own with its own API client, so a slow or restarting apiserver
never blocks the agent's loop. Events are ``("SYNC", list)`` after each (re)list, then
``ADDED``/``MODIFIED``/``DELETED`` with the pod as the API server's JSON.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from local_cluster.pod_references import Body

log = logging.getLogger("node-agent")


def watch_pods(kubeconfig: Path, events: queue.Queue[tuple[str, Body]], stopping: threading.Event) -> None:
    """Feed ``events`` until ``stopping`` is set; keeps watching through apiserver restarts."""
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    while not stopping.is_set():
        try:
            raw: Any = api.list_pod_for_all_namespaces(_preload_content=False)  # urllib3 response
            listing = json.loads(raw.data)
            events.put(("SYNC", listing))
            stream = watch.Watch().stream(
                api.list_pod_for_all_namespaces,
                resource_version=listing["metadata"]["resourceVersion"],
                timeout_seconds=30,
                deserialize=False,
            )
            for event in stream:
                if stopping.is_set():
                    return
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    events.put((event["type"], event["object"]))
                elif event["type"] == "ERROR":
                    break  # e.g. 410 Gone: relist
        except Exception as error:  # keep watching through apiserver restarts and timeouts
            if stopping.is_set():
                return
            log.warning("pod watch failed (%s); relisting in 1s", error)
            time.sleep(1)
