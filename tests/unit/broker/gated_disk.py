"""A journal disk that a test controls: each write waits for the test, and can be made to fail."""

from __future__ import annotations

import threading

from broker_service.journal import Journal


class GatedDisk:
    """Stands in for ``Journal._write_sync``: each write waits until the test opens the gate.

    The writes run in a worker thread (``asyncio.to_thread``), so the gate is a thread event.
    """

    def __init__(self, journal: Journal) -> None:
        self.real = journal._write_sync
        self.started = threading.Event()
        self.gate = threading.Event()
        self.fail = False
        self.writes = 0

    def __call__(self, blob: bytes) -> None:
        self.started.set()
        self.gate.wait(timeout=30)
        self.writes += 1
        if self.fail:
            raise OSError(5, "Input/output error (injected)")
        self.real(blob)

    @classmethod
    def install(cls, journal: Journal) -> GatedDisk:
        """Put a gated disk under an open journal; writes from now on wait for :attr:`gate`."""
        disk = cls(journal)
        journal._write_sync = disk  # type: ignore[method-assign]
        return disk
