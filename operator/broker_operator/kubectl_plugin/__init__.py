"""``kubectl broker``: the kubectl plugin for BrokerClusters (issue 12), in the spirit of ``kubectl cnpg``.

Installed with the package as the console script ``kubectl-broker``; kubectl finds ``kubectl-*``
executables on PATH, so ``kubectl broker status`` runs it. One module per concern:

- ``cli``: arguments, kubeconfig flags, exit codes, dispatch;
- ``kube``: the Kubernetes calls (the user's kubeconfig), with errors that name the verb and resource;
- ``admin``: the broker's admin SOAP operations (``ListHeld``, ``ReplayHeld``, ``DiscardHeld``);
- ``status_view``: the status document (``-o json``) and its terminal rendering, pure;
- ``switchover``: set ``spec.preferredActive`` and wait for the active to move;
- ``held``: list, replay and discard held messages;
- ``report``: the validator's verdict and its report.

It reads what the operator and the validator wrote and asks brokers directly; it never decides a
failover itself: a switchover is a request to the operator through the spec, as with raw kubectl.
"""
