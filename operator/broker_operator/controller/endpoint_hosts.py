"""The installer's allowlist of the hosts a BrokerCluster's ``spec.endpoints[].url`` may name.

In endpoints mode the operator heartbeats whatever URL the spec gives, with the cluster's operator
token, and a broker's reply (its unavailability message) reaches the status. Without a limit, who
may write a BrokerCluster may make the operator send that token to a server of theirs, or POST to
any service the operator's pod can reach and read the answer back (the cloud's metadata address,
the API server, a neighbour's admin port). The installer, who knows where the external brokers
live, lists them: host name patterns (``*.erp.example.com``: fnmatch, case-insensitive, ``*``
spans dots) and networks (``10.20.0.0/16``, ``fd00::/8``, matched against a URL whose host is an
address). ``*`` allows every host.

What it does not do: resolve names. A pattern allows a name; where that name points is DNS's
business (list networks of literal addresses where that matters). Pod-mode targets are the pods'
own addresses, chosen by the operator, and are not checked here.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class EndpointHosts:
    names: tuple[str, ...] = ()  # lower-case fnmatch patterns
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, patterns: Iterable[str]) -> EndpointHosts:
        """From the installer's list; raises ValueError naming a pattern that is neither."""
        names: list[str] = []
        networks: list[Network] = []
        for raw in patterns:
            pattern = raw.strip().lower()
            if not pattern:
                continue
            if "/" in pattern or _is_address(pattern):
                try:
                    networks.append(ipaddress.ip_network(pattern, strict=False))
                except ValueError as error:
                    raise ValueError(f"endpoint host pattern {raw!r} is not a network ({error})") from None
            elif all(c.isalnum() or c in "-.*?" for c in pattern):
                names.append(pattern)
            else:
                raise ValueError(
                    f"endpoint host pattern {raw!r} is neither a host name pattern "
                    "(letters, digits, '-', '.', '*')"
                    " nor a network (10.0.0.0/8)"
                )
        return cls(tuple(sorted(set(names))), tuple(sorted(set(networks), key=str)))

    def allows(self, url: str) -> bool:
        host = host_of(url)
        if not host:
            return False
        if _is_address(host):
            address = ipaddress.ip_address(host)
            return "*" in self.names or any(address in network for network in self.networks)
        return any(fnmatch.fnmatchcase(host, pattern) for pattern in self.names)

    def describe(self) -> str:
        listed = [*self.names, *(str(n) for n in self.networks)]
        return ", ".join(listed) if listed else "none"


def host_of(url: str) -> str:
    """The host the URL connects to, lower-case, without brackets or userinfo; '' if it has none."""
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def endpoint_refusals(endpoints: Iterable[tuple[str, str]], allowed: EndpointHosts | None) -> list[str]:
    """One message per ``(name, url)`` outside ``allowed`` (None: no allowlist, all allowed)."""
    if allowed is None:
        return []
    return [
        f"spec.endpoints url host {host_of(url) or '(none)'} (endpoint {name}) is not in the operator's "
        f"allowed endpoint hosts ({allowed.describe()}); the operator sends nothing to it. Whoever "
        "installed the operator can add it (chart value operator.endpointHosts)"
        for name, url in endpoints
        if not allowed.allows(url)
    ]
