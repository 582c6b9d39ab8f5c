"""The broker-failover operator (kopf): reconciles BrokerClusters and runs the heartbeat loop.

Named broker_operator, never `operator`, which would shadow the standard library.
"""
