"""The operator's ``Heartbeat`` request as bytes, for benchmarks that heartbeat brokers without zeep.

The same envelope the operator's zeep client sends for ``Heartbeat(active, epoch, operatorId)``
(the tests check zeep's against the WSDL); written out here so that a benchmark's client costs
next to nothing beside the broker it measures.
"""

from __future__ import annotations

from broker_contracts import soap


def heartbeat_body(epoch: int, *, active: bool = True, operator_id: str = "bench") -> bytes:
    return (
        f'<soap:Envelope xmlns:soap="{soap.SOAP_ENV_NAMESPACE}" xmlns:t="{soap.NAMESPACE}"><soap:Body>'
        f"<t:Heartbeat><t:active>{'true' if active else 'false'}</t:active><t:epoch>{epoch}</t:epoch>"
        f"<t:operatorId>{operator_id}</t:operatorId></t:Heartbeat></soap:Body></soap:Envelope>"
    ).encode()
