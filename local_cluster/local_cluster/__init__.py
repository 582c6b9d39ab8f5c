"""A local Kubernetes cluster for the end-to-end tests and demos.

The control plane is the real thing, built from Go modules by ``hack/tools/build.sh``
(etcd, kube-apiserver, kube-controller-manager, kube-scheduler). The cluster (``sealed_cluster``:
``make cluster-up``, the demo, the soak, the Kubernetes benchmark, the e2e tests) runs it with a
real kubelet on containerd and runc (``kubelet_node``, ``containerd_sandbox``; images from
``image_build`` and ``image_archives``, pod start read from the kubelet's log by ``kubelet_log``)
in network, mount and PID namespaces of its own (``netns``, ``cluster_services``). See
``docs/local-cluster.md``.

Modules: ``pki`` (certificates and kubeconfigs), ``processes`` (process groups that
never outlive us), ``control_plane`` (start and wait for the Go components), ``restarts`` (the
API server restarted as a static pod's kubelet would), ``local_path_storage`` (kind's
local-path-provisioner and the StorageClasses claims bind through), ``cgroups`` (the node's
cgroup root), ``cluster`` (settings, kubectl/helm/API access, the built tools), ``cluster_cli``
(the ``make cluster-up/shell/down`` CLI, run as ``python -m local_cluster.cluster``),
``cluster_state`` (its supervisor's state file), and on top ``relay`` and ``soak``. Beside the
cluster, for brokers and simulators run as local processes: ``broker_certificates`` (openssl
certificates of the brokers' TLS layout), ``run_pki`` (one run's CA and certificates) and
``loopback_relay`` (a broker and both simulators on loopback, TLS on every leg or none).

A package the project ships (not under ``tests/``), so that what users run, such as a demo on
the local cluster, never imports the test suite.
"""
