"""Fixtures shared by the unit tests of more than one part."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator

import pytest


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """``configure_logging`` changes process-wide state (the root logger's handlers and level, the
    exception hooks, warnings capture); a test that uses this leaves it as it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    excepthook, thread_hook = sys.excepthook, threading.excepthook
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.excepthook, threading.excepthook = excepthook, thread_hook
        logging.captureWarnings(False)
