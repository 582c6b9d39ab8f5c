"""A local Kubernetes cluster for the end-to-end tests and demos.

The control plane is the real thing, built from Go modules by ``hack/tools/build.sh``
(etcd, kube-apiserver, kube-controller-manager, kube-scheduler). The sealed cluster
(``sealed_cluster``: the demo, the soak, the Kubernetes benchmark, most e2e tests) runs it with a
real kubelet on containerd and runc (``kubelet_node``, ``containerd_sandbox``; images from
``image_build``, pod start read from the kubelet's log by ``kubelet_log``) in network, mount and
PID namespaces of its own (``netns``, ``cluster_services``). The older loopback cluster
(``cluster``, the ``kube_cluster`` fixture) still has one fake part, the node agent
(``node_agent``), which plays scheduler and kubelet for a single Node by running each container
as a local process. See ``docs/local-cluster.md``.

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
