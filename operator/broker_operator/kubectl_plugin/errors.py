"""The plugin's exit codes and the one exception type that carries them to ``cli.main``.

Exit codes, as docs/kubectl-plugin.md documents them:

- 0: the command did what it was asked;
- 1: the operation was attempted and failed (refused by the API server or RBAC, a broker
  unreachable or refusing, a switchover that did not complete in time);
- 2: nothing was attempted: bad arguments, an unusable kubeconfig or context, or a BrokerCluster or
  broker that does not exist.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


class PluginError(Exception):
    """A failure to report in one English sentence (what, with which value, what to do)."""

    exit_code: int = EXIT_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(PluginError):
    """The command line or the configuration names something that does not exist; exit 2."""

    exit_code = EXIT_USAGE
