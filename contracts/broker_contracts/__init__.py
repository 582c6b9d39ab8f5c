"""The contracts between broker-failover's parts, in one place.

Everything that crosses a process boundary is defined here and only here:
the broker's SOAP contract (``wsdl/broker.wsdl`` and the names in
:mod:`broker_contracts.soap`) and the message-log record schema
(:mod:`broker_contracts.message_log`). The broker, the operator, the
simulators and the Spark validator import these; none of them copies them.
So do their log lines: :mod:`broker_contracts.logs` is the one place that sets
every process's log format and level.

This package holds no behaviour beyond encoding and checking the contracts:
no I/O besides reading the packaged WSDL and, in :mod:`broker_contracts.tls`, the
certificate files a TLS context is built from; no asyncio, no Kubernetes.
"""

from importlib import resources
from pathlib import Path


def wsdl_path() -> Path:
    """Path of the broker's WSDL file, as installed with this package."""
    return Path(str(resources.files(__package__).joinpath("wsdl/broker.wsdl")))


def wsdl_text() -> str:
    """The broker's WSDL document, as served at ``?wsdl``."""
    return wsdl_path().read_text(encoding="utf-8")
