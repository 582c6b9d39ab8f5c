"""Run ``broker-service`` under cProfile with a CPU-time clock: ``profile_broker.py OUT.prof [broker flags]``.

Used by ``bench_broker.py --profile``. CPU time rather than wall time, because
this machine is shared: wall-clock profiles charge other processes' time slices
to whatever function happened to be running.
"""

from __future__ import annotations

import cProfile
import sys
import time

from broker_service.__main__ import main as broker_main


def main() -> int:
    out = sys.argv[1]
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        return broker_main(sys.argv[2:])
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    raise SystemExit(main())
