"""``make bench-validator`` in small: a 5,000-record store, DuckDB and the Spark validator, full and
incremental, each finding exactly the generator's manifest."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.bench.support import assert_succeeded, headline, run_bench

RUNS = ("duckdb", "validator warm-up", "validator full", "validator incremental")


def test_bench_validator_smoke(tmp_path: Path) -> None:
    # The store cache in tmp_path: never ~/.cache's gigabytes, never a stale entry from there.
    run = run_bench(
        "bench_validator.py",
        *("--records", "5000", "--streams", "4", "--cores", "2", "--cache", str(tmp_path / "cache")),
        timeout=300,
    )
    # The bench exits 1 when any engine's counts differ from the manifest: a mismatch fails here.
    assert_succeeded(run)
    assert headline(run, "validator_records_per_s") > 0
    assert "MISMATCH" not in run.stderr, run.explain()
    found = {
        engine: json.loads(text)
        for engine, text in re.findall(
            r"\] (.+?): anomaly counts equal the manifest (\{.*\})$", run.stderr, re.MULTILINE
        )
    }
    assert set(found) == set(RUNS), run.explain()
    injected = re.search(r"^injected: (\{.*\})$", run.stdout, re.MULTILINE)
    assert injected, run.explain()
    # What the full runs found is what the generator injected into the base store.
    assert found["duckdb"] == found["validator full"] == json.loads(injected.group(1)), run.explain()
    assert found["duckdb"]["lost"] > 0  # the manifest's classes are really there to be found
