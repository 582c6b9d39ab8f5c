"""Broker pods held to the "restricted" Pod Security Standard, and ``spec.image`` to the installer's list.

``spec.podSecurityContext`` and ``spec.securityContext`` replace the operator's defaults (which
are restricted) whole, and ``spec.image`` may name any image. So whoever may write a BrokerCluster
could have the operator run a privileged root container of their choosing, though RBAC may not
let them create pods. With the setting ``broker_pod_security = "restricted"`` (the default, and
the chart's) the operator checks the effective contexts against the fields of the standard's
``restricted`` level that a securityContext carries (https://kubernetes.io/docs/concepts/security/
pod-security-standards/) and refuses the spec before any pod is made; ``"unchecked"`` leaves that to
the namespace's Pod Security admission. ``broker_images`` (fnmatch patterns, empty: any) limits
the images.

What it does not replace: Pod Security admission (label the namespace
``pod-security.kubernetes.io/enforce: restricted``), which checks every pod of the namespace,
volumes included. This check is earlier and names the BrokerCluster's field; it is pure.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker_operator.controller.builders import (
    DEFAULT_CONTAINER_SECURITY_CONTEXT,
    DEFAULT_POD_SECURITY_CONTEXT,
)

POD_SECURITY_LEVELS: Final = ("restricted", "unchecked")
_SECCOMP_ALLOWED: Final = ("RuntimeDefault", "Localhost")
_CAPABILITIES_ADDABLE: Final = ("NET_BIND_SERVICE",)
_SELINUX_TYPES: Final = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
# The "safe" sysctls of the baseline level (which restricted includes), as of Kubernetes 1.32.
_SAFE_SYSCTLS: Final = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
)
POD: Final = "spec.podSecurityContext"
CONTAINER: Final = "spec.securityContext"


@dataclass(frozen=True)
class BrokerImages:
    patterns: tuple[str, ...] = ()  # empty: any image

    @classmethod
    def parse(cls, patterns: Iterable[str]) -> BrokerImages:
        return cls(tuple(sorted({p.strip() for p in patterns if p.strip()})))

    def allows(self, image: str) -> bool:
        return not self.patterns or any(fnmatch.fnmatchcase(image, p) for p in self.patterns)


def restricted_violations(pod: Mapping[str, Any] | None, container: Mapping[str, Any] | None) -> list[str]:
    """What in the given contexts (None: the operator's default) the restricted level forbids."""
    pod = DEFAULT_POD_SECURITY_CONTEXT if pod is None else pod
    container = DEFAULT_CONTAINER_SECURITY_CONTEXT if container is None else container
    found = [
        m for path, context in ((POD, pod), (CONTAINER, container)) for m in _either_level(path, context)
    ]
    found += _pod_level(pod, container) + _container_level(container)
    return found


def _either_level(path: str, context: Mapping[str, Any]) -> list[str]:
    """The fields a pod's and a container's securityContext share."""
    found: list[str] = []
    if context.get("runAsNonRoot") is False:
        found.append(f"{path}.runAsNonRoot is false; the broker must run as non-root")
    if context.get("runAsUser") == 0:
        found.append(f"{path}.runAsUser is 0 (root)")
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in _SECCOMP_ALLOWED:
        found.append(f"{path}.seccompProfile.type is {seccomp}; allowed: {', '.join(_SECCOMP_ALLOWED)}")
    selinux = (context.get("seLinuxOptions") or {}).get("type")
    if selinux is not None and selinux not in _SELINUX_TYPES:
        found.append(f"{path}.seLinuxOptions.type ({selinux}) is not a container type")
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{path}.windowsOptions.hostProcess is true")
    return found


def _pod_level(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    """What must hold of the two together, and the pod's sysctls."""
    found: list[str] = []
    if not (pod.get("runAsNonRoot") is True or container.get("runAsNonRoot") is True):
        found.append(f"neither {POD} nor {CONTAINER} sets runAsNonRoot: true")
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    container_seccomp = (container.get("seccompProfile") or {}).get("type")
    if pod_seccomp is None and container_seccomp is None:
        found.append(f"neither {POD} nor {CONTAINER} sets a seccompProfile (RuntimeDefault or Localhost)")
    unsafe = [s.get("name") for s in pod.get("sysctls") or [] if s.get("name") not in _SAFE_SYSCTLS]
    if unsafe:
        found.append(f"{POD}.sysctls names sysctls outside the safe set: {', '.join(map(str, unsafe))}")
    return found


def _container_level(container: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    if container.get("privileged") is True:
        found.append(f"{CONTAINER}.privileged is true")
    if container.get("allowPrivilegeEscalation") is not False:
        found.append(f"{CONTAINER}.allowPrivilegeEscalation must be false")
    if container.get("procMount") not in (None, "Default"):
        found.append(f"{CONTAINER}.procMount must be Default")
    capabilities = container.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append(f"{CONTAINER}.capabilities.drop must include ALL")
    added = [c for c in capabilities.get("add") or [] if c not in _CAPABILITIES_ADDABLE]
    if added:
        found.append(
            f"{CONTAINER}.capabilities.add may hold only NET_BIND_SERVICE, not {', '.join(map(str, added))}"
        )
    return found


def pod_security_refusals(
    image: str,
    pod: Mapping[str, Any] | None,
    container: Mapping[str, Any] | None,
    *,
    level: str,
    images: BrokerImages,
    image_from: str = "spec.image",
) -> list[str]:
    """Every reason the operator may not make broker pods of this spec under its settings;
    ``image_from`` names where the image came from (the spec, or the operator's --broker-image)."""
    found = []
    if not images.allows(image):
        found.append(
            f"{image_from} ({image}) matches none of the operator's allowed broker images "
            f"({', '.join(images.patterns)}; chart value operator.brokerImages)"
        )
    if level == "restricted":
        found += [
            f"{message} (the operator holds broker pods to the restricted Pod Security Standard; "
            "chart value operator.brokerPodSecurity)"
            for message in restricted_violations(pod, container)
        ]
    return found
