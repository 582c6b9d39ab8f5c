"""A local Kubernetes cluster for the end-to-end tests and demos: real control plane, one fake node.

The control plane is the real thing, built from Go modules by ``hack/tools/build.sh``
(etcd, kube-apiserver, kube-controller-manager), run on loopback in a temporary
directory the way controller-runtime's envtest does. The one fake part is the node
agent (``node_agent``), which plays scheduler and kubelet for a single Node by
running each container as a local process. See ``docs/local-cluster.md``.

Modules: ``pki`` (certificates and kubeconfigs), ``processes`` (process groups that
never outlive us), ``control_plane`` (start and wait for the Go components),
``cluster`` (control plane plus node agent; the ``make cluster-up`` CLI),
``node_agent`` and its helpers ``pod_sandbox`` (env, volumes, path rewriting) and
``images`` (the image-to-command table in ``images.yaml``).

A package the project ships (not under ``tests/``), so that what users run, such as a demo on
the local cluster, never imports the test suite.
"""
