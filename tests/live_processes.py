"""Which live processes name something: what a test that stopped a run looks for to prove that
nothing of it was left (``/proc``, read-only)."""

from __future__ import annotations

from pathlib import Path


def processes_naming(*needles: str, environment: bool = False) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line, or with ``environment`` its
    environment too (an operator finds its kubeconfig in ``KUBECONFIG``), contains any of ``needles``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            places = [command]
            if environment:
                places.append((entry / "environ").read_bytes().decode(errors="replace"))
        except OSError:  # ended while we looked
            continue
        if any(needle in place for needle in needles for place in places):
            found.append((int(entry.name), command))
    return found
