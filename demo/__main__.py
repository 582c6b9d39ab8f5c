"""`make demo`: not built yet; says what it will do and fails rather than pretend."""

import sys

PLAN = """\
make demo will, once the broker (issue 3) and the operator (issue 4) land:
  1. start the backend and cloud simulators and two brokers on loopback;
  2. run the operator's local runner on a BrokerCluster in endpoints mode;
  3. send ordered traffic, kill -9 the active broker, watch the failover;
  4. check that the cloud received every stream in order with no loss.
It does none of that yet."""


def main() -> int:
    print(PLAN, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
