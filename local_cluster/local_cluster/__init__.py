"""A local Kubernetes cluster for the end-to-end tests and demos: real control plane, one fake node.

The control plane is the real thing, built from Go modules by ``hack/tools/build.sh``
(etcd, kube-apiserver, kube-controller-manager), run on loopback in a temporary
directory the way controller-runtime's envtest does. The one fake part is the node
agent (``node_agent``), which plays scheduler and kubelet for a single Node by
running each container as a local process. See ``docs/local-cluster.md``.

Modules: ``pki`` (certificates and kubeconfigs), ``processes`` (process groups that
never outlive us), ``control_plane`` (start and wait for the Go components),
``cluster`` (control plane plus node agent, as a library), ``cluster_cli`` (the
``make cluster-up/shell/down`` CLI, run as ``python -m local_cluster.cluster``) and
``cluster_state`` (its supervisor's state file). The node agent: ``node_agent`` (the
reconcile loop), ``node_settings``, ``node_registration`` (the Node), ``pod_watch``,
``pod_status_reporter``; per pod ``pod_runtime`` with ``container_state``,
``container_lifecycle`` (processes, restarts) and ``probes``; ``pod_sandbox`` with
``pod_references``, ``pod_volumes`` (volumes, mounts, path rewriting), ``atomic_writer``,
``container_env`` and ``pod_launcher``; ``kubelet_api`` with ``container_logs`` and
``log_streaming`` (``kubectl logs``); ``images`` (the image-to-command table in
``images.yaml``).

A package the project ships (not under ``tests/``), so that what users run, such as a demo on
the local cluster, never imports the test suite.
"""
