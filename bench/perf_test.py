"""RabbitMQ's own load generator, PerfTest (``com.rabbitmq:perf-test`` on Maven Central), for the
broker benchmark: fetched once into a cache outside git, then run as a bounded subprocess.

The jar on Maven Central is the library, not the self-contained one of PerfTest's releases, so
``mvn dependency:copy-dependencies`` (the machine's Maven, strict checksums) resolves it with its
dependencies into ``~/.cache/broker-failover/perf-test/<version>/lib``, its local repository
beside it. PerfTest's own jar is then checked against the ``.sha1`` Maven Central published for it
(Maven keeps that file in the local repository), and a stamp records the check: a second run
finds the stamp and the jars and makes no network request.

:func:`run` starts ``java -cp lib/* com.rabbitmq.perf.PerfTest`` in a session of its own, waits
up to a timeout, and always kills the session afterwards; :func:`parse_summary` reads the
summary lines PerfTest prints when it stops.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

VERSION = "2.22.1"
GROUP, ARTIFACT = "com.rabbitmq", "perf-test"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "broker-failover" / "perf-test"
MAIN_CLASS = "com.rabbitmq.perf.PerfTest"
JAVA = "java"
RESOLVE_TIMEOUT_SECONDS = 600.0

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.broker-failover</groupId><artifactId>perf-test-fetch</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""


class PerfTestError(RuntimeError):
    """PerfTest could not be fetched or did not finish; the message says what was run and seen."""


def say(text: str) -> None:
    print(f">> perf-test: {text}", file=sys.stderr, flush=True)


def classpath(version: str = VERSION, cache: Path = CACHE) -> str:
    """``<cache>/<version>/lib/*``, fetching and checking the jars first if they are not there."""
    home = cache / version
    lib = home / "lib"
    jar = lib / f"{ARTIFACT}-{version}.jar"
    stamp = home / "verified.sha1"
    if stamp.exists() and jar.exists() and stamp.read_text().strip() == sha1(jar):
        return f"{lib}/*"
    fetch(version, home)
    return f"{lib}/*"


def fetch(version: str, home: Path) -> None:
    """Resolve PerfTest and its dependencies with Maven into ``home/lib``; check PerfTest's sha1."""
    if shutil.which("mvn") is None:
        raise PerfTestError("mvn not found: Maven is needed once to fetch PerfTest from Maven Central")
    home.mkdir(parents=True, exist_ok=True)
    staging = home / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (home / "pom.xml").write_text(POM.format(group=GROUP, artifact=ARTIFACT, version=version))
    repo = home.parent / "m2"
    argv = [
        "mvn",
        "--batch-mode",
        "--quiet",
        "--strict-checksums",
        f"-Dmaven.repo.local={repo}",
        "-f",
        str(home / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
    ]
    say(f"fetching {GROUP}:{ARTIFACT}:{version} and its dependencies from Maven Central into {home}")
    try:
        done = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise PerfTestError(f"{' '.join(argv)} did not finish in {RESOLVE_TIMEOUT_SECONDS:.0f}s") from None
    if done.returncode != 0:
        raise PerfTestError(
            f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    jar = staging / f"{ARTIFACT}-{version}.jar"
    published = repo / GROUP.replace(".", "/") / ARTIFACT / version / f"{ARTIFACT}-{version}.jar.sha1"
    if not jar.exists() or not published.exists():
        raise PerfTestError(f"after Maven: {jar} or {published} missing")
    expected = published.read_text().split()[0].strip().lower()
    actual = sha1(jar)
    if actual != expected:
        raise PerfTestError(f"{jar}: sha1 {actual}, but Maven Central published {expected}")
    shutil.rmtree(home / "lib", ignore_errors=True)
    staging.rename(home / "lib")
    (home / "verified.sha1").write_text(actual + "\n")
    jars = len(list((home / "lib").iterdir()))
    say(f"{ARTIFACT}-{version}.jar sha1 {actual} matches Maven Central's; {jars} jars in {home / 'lib'}")


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Summary:
    """What PerfTest printed when it stopped: average rates (msg/s) and latencies (µs)."""

    sending_rate: float
    receiving_rate: float
    confirm_latency_us: dict[str, float]
    consumer_latency_us: dict[str, float]
    stop_reason: str


_RATE = re.compile(r"(sending|receiving) rate avg: ([\d.]+) msg/s")
_LATENCY = re.compile(r"(confirm|consumer) latency min/median/75th/95th/99th ([\d./]+) µs")
_STOPPED = re.compile(r"^test stopped \((.*)\)$", re.MULTILINE)


def parse_summary(text: str) -> Summary:
    rates = {kind: float(value) for kind, value in _RATE.findall(text)}
    latencies: dict[str, dict[str, float]] = {}
    for kind, values in _LATENCY.findall(text):
        latencies[kind] = dict(
            zip(("min", "p50", "p75", "p95", "p99"), map(float, values.split("/")), strict=True)
        )
    stopped = _STOPPED.search(text)
    if "sending" not in rates or stopped is None:
        raise PerfTestError(f"no PerfTest summary in its output:\n{text[-3000:]}")
    return Summary(
        sending_rate=rates["sending"],
        receiving_rate=rates.get("receiving", 0.0),
        confirm_latency_us=latencies.get("confirm", {}),
        consumer_latency_us=latencies.get("consumer", {}),
        stop_reason=stopped.group(1),
    )


def run(
    cp: str,
    uri: str,
    options: list[str],
    log: Path,
    timeout: float,
    *,
    java_options: tuple[str, ...] = (),
) -> tuple[Summary, float]:
    """PerfTest against ``uri`` with ``options`` (``java_options`` for the JVM: TLS stores); its
    summary and the CPU seconds its JVM used (from the reaped child's rusage: call it with no other
    child about to exit)."""
    before = children_cpu_seconds()
    argv = [JAVA, *java_options, "-cp", cp, MAIN_CLASS, "--uri", uri, *options]
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PerfTestError(
                f"PerfTest did not stop within {timeout:.0f}s: {' '.join(argv)}\n{log.read_text()[-2000:]}"
            ) from None
        finally:
            kill_session(process)
    text = log.read_text(errors="replace")
    if process.returncode != 0:
        raise PerfTestError(f"{' '.join(argv)} exited {process.returncode}:\n{text[-3000:]}")
    return parse_summary(text), children_cpu_seconds() - before


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kill_session(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL the process's session (its own, by start_new_session) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10.0)


if __name__ == "__main__":
    try:
        print(classpath())
    except PerfTestError as error:
        raise SystemExit(f"perf-test: {error}") from None
