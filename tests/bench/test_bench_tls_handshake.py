"""``make bench-tls-handshake`` in small: 50 heartbeats on new connections and 500 on one, per mode,
against a real TLS broker's admin port (mutual TLS) and a plain one."""

from __future__ import annotations

import re

from tests.bench.support import assert_succeeded, headline, run_bench

MODES = ("tls_new", "tls_keepalive", "http_new", "http_keepalive")


def test_bench_tls_handshake_smoke() -> None:
    run = run_bench(
        "bench_tls_handshake.py",
        "--handshakes",
        "50",
        "--keepalive",
        "500",
        "--idle-seconds",
        "1",
        timeout=120,
    )
    assert_succeeded(run)
    assert headline(run, "tls_handshake_vs_keepalive_cpu") > 0
    # Each broker was heartbeated into Active where it should be: the TLS one over https only.
    assert re.search(r"tls-broker: Active on https://", run.stderr), run.explain()
    assert re.search(r"plain-broker: Active on http://", run.stderr), run.explain()
    for mode in MODES:
        count = 50 if mode.endswith("_new") else 500
        line = re.search(
            rf"^{mode} heartbeats=(\d+) broker_cpu_ms_per_heartbeat=(\S+) client_cpu_ms_per_heartbeat=(\S+) "
            r"wall_ms_per_heartbeat=(\S+)$",
            run.stdout,
            re.MULTILINE,
        )
        assert line, run.explain()
        assert int(line[1]) == count and all(float(line[i]) > 0 for i in (2, 3, 4)), run.explain()
    for ratio in ("client_tls_handshake_vs_keepalive_cpu", "tls_new_vs_http_new_cpu"):
        match = re.search(rf"^{ratio}=(\d+(?:\.\d+)?)$", run.stdout, re.MULTILINE)
        assert match and float(match[1]) > 0, run.explain()
    assert re.search(r"^tls_keepalive_vs_http_keepalive_cpu=\d", run.stdout, re.MULTILINE), run.explain()
