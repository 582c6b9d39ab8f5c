"""The BrokerCluster controller: kopf handlers, the Kubernetes shell of the failover engine, child builders.

Layers, low to high: ``names`` and ``bodies`` (the Kubernetes vocabulary),
``spec`` (a checked, defaulted spec), ``builders`` / ``conflicts`` /
``rollout`` / ``observed`` (pure functions), ``kube`` and ``epochs`` (the API
calls), ``shell`` (the engine's ``ClusterShell``), ``reconcile`` and
``daemon`` (what a handler does), ``handlers`` (kopf registration).

The failover decisions are not here: they are the engine's
(``broker_operator.engine`` and ``broker_operator.core``).
"""
