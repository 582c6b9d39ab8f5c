"""The operator's logging: kopf's lines and its own in one format and at one level, events untouched.

kopf logs through Python's logging: the ``kopf.*`` loggers, and ``kopf.objects`` for what it says
about one object. The operator starts kopf with ``kopf.run()``, which configures no logging, so
kopf's records reach the root handler that :func:`broker_contracts.logs.configure_logging`
installs, in the format and at the level of the operator's own lines (``--log-format`` /
``--log-level``, ``BROKER_FAILOVER_LOG_FORMAT`` / ``BROKER_FAILOVER_LOG_LEVEL``).

Why not kopf's own configuration (``kopf.configure``, ``kopf run --log-format json``): its JSON is
python-json-logger's, with other field names (``timestamp``, ``severity``) than every other
broker-failover process writes, and its levels are ``--verbose``/``--quiet`` rather than a level.

Events are not logging here, so neither the format nor the level can change them: the operator
posts its events by calling kopf (``kopf.info``, ``kopf.warn``, ``kopf.exception``), which queues
them whatever Python logging says, or through the API (the engine's, ``KubeApi.create_event``), and
kopf's bridge from ``kopf.objects`` log records to events
(``settings.posting.loggers``) is off, as kopf's default (``handlers.configure_kopf`` leaves it).
Whoever turns that bridge on must keep ``kopf.objects`` at INFO or below whatever the level: at
WARNING its INFO records would no longer be made, and their Normal events would stop.

In JSON, a kopf object record carries the object as ``object`` (kopf's own JSON key):
``apiVersion``, ``kind``, ``namespace``, ``name``, ``uid``; kopf's ``settings`` and ``k8s_skip``
are left out. The text format is as it was (no ``[namespace/name]`` prefix).

What this module does not do: silence asyncio's logger as ``kopf.configure`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TextIO

from broker_contracts.logs import LogSettings, configure_logging

# How kopf's fields on a record show in JSON (kopf/_core/actions/loggers.py, ObjectLogger).
KOPF_EXTRA_NAMES: Final[Mapping[str, str | None]] = {"k8s_ref": "object", "k8s_skip": None, "settings": None}


def configure_operator_logging(log: LogSettings, *, stream: TextIO | None = None) -> None:
    """The operator's and kopf's records at ``log.level`` and up, to stderr, in ``log.format``."""
    configure_logging(log, stream=stream, extra_names=KOPF_EXTRA_NAMES)
