"""A reference to one key of a Secret, as a BrokerCluster's spec names it (``{name, key}``).

Its own module because both spec parsers use it, ``spec.py`` (``auth``, ``backend``, ``cloud``)
and ``tls_spec.py`` (the CA bundles), and ``spec.py`` imports ``tls_spec.py``. It reads and
checks the reference's shape; whether the Secret may be used is ``credentials.py``'s question.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker_operator.core import spec_fields as fields


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str


def read_secret_ref(raw: object, key: fields.TextField, problems: list[str]) -> SecretRef | None:
    """The Secret reference whose ``key`` field is ``key`` (its path names the reference); None if
    absent. The key's default is the CRD's (``key.default``)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw.get("name"):
        path = "spec." + key.path.rsplit(".", 1)[0]
        problems.append(f"{path} must name a Secret: {{name, key}}, got {raw!r}")
        return None
    return SecretRef(str(raw["name"]), str(raw.get("key") or key.default))
