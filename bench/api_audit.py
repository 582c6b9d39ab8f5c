"""The operator's API requests, from the API server's audit log: read, counted, drawn.

``bench/bench_operator_k8s.py`` runs the operator as a ServiceAccount (``ACCOUNT``), and the local
control plane audits every ServiceAccount's requests at the Metadata level
(``local_cluster.control_plane.AUDIT_POLICY``), so each line names the verb and the resource.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

from local_cluster.control_plane import audit_events

ACCOUNT = "system:serviceaccount:bench:broker-operator"
WRITES = ("create", "update", "patch", "delete", "deletecollection")
Request = tuple[float, str, str]  # (wall-clock time, verb, resource[/subresource])


def operator_requests(audit_log: Path) -> list[Request]:
    """(time, verb, resource) of every request the operator's ServiceAccount made, as audited."""
    requests = []
    for entry in audit_events(audit_log):
        if entry.get("stage") != "ResponseComplete" or entry["user"]["username"] != ACCOUNT:
            continue
        at = datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        ref = entry.get("objectRef") or {}
        resource = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
        requests.append((at, entry["verb"], resource))
    return requests


def plot(requests: list[Request], marks: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start_at = min(marks.values())
    seconds = int(max([at for at, _, _ in requests] + list(marks.values())) - start_at) + 2
    figure, axis = plt.subplots(figsize=(10, 3.6))
    for index, (label, verbs) in enumerate(
        (("writes", WRITES), ("reads and watches", ("get", "list", "watch")))
    ):
        per_second = [0] * seconds
        for at, verb, _ in requests:
            if verb in verbs and at >= start_at:
                per_second[int(at - start_at)] += 1
        axis.step(range(seconds), per_second, where="post", label=f"operator {label}/s", color=f"C{index}")
    for index, (label, at) in enumerate(marks.items()):
        axis.axvline(at - start_at, color="grey", linestyle=":" if index % 2 else "--", linewidth=1)
        axis.annotate(
            label,
            (at - start_at, 0.97 if index % 2 == 0 else 0.45),  # neighbours apart
            xycoords=("data", "axes fraction"),
            fontsize=8,
            rotation=90,
            va="top",
        )
    axis.set_yscale("symlog", linthresh=1)
    axis.set_ylim(bottom=0)
    axis.set_xlabel("seconds since the operator started")
    axis.set_ylabel("API requests per second")
    axis.set_title("The operator's API requests (audit log) while its clusters come up, then while steady")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def in_window(requests: list[Request], since: float, until: float) -> Counter[str]:
    return Counter(f"{verb} {resource}" for at, verb, resource in requests if since <= at < until)


def counts(requests: Counter[str], verbs: tuple[str, ...]) -> str:
    return (
        ", ".join(f"{what} {n}" for what, n in requests.most_common() if what.split()[0] in verbs) or "none"
    )


def describe(counts: Counter[str], seconds: float) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{what} {count / seconds:.2f}/s" for what, count in counts.most_common())
