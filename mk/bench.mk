# What `make bench-broker` compares our broker with (issue 25): Debian's RabbitMQ, started by the
# benchmark on loopback with a data directory of its own, and RabbitMQ's load generator PerfTest
# (a Java jar from Maven Central, cached under ~/.cache/broker-failover/perf-test/). The benchmark's
# smoke test in `make test` runs both, so they are test prerequisites. See docs/benchmarks.md.

# The script the benchmark runs (Debian's /usr/sbin wrapper would switch to the rabbitmq user).
BENCH_PACKAGES := /usr/lib/rabbitmq/bin/rabbitmq-server=rabbitmq-server

TEST_PREREQS += bench-packages perf-test-jar

##@ Benchmark peers

.PHONY: bench-packages
bench-packages: ## Install Debian's rabbitmq-server with apt-get, its system service not started; no-op when there.
	@hack/without-service-start.sh hack/host-packages.sh $(BENCH_PACKAGES)

.PHONY: perf-test-jar
perf-test-jar: venv ## Fetch RabbitMQ's PerfTest and its dependencies from Maven Central once (sha1-checked); no-op when cached.
	@hack/preflight.sh java
	@$(BIN)/python bench/perf_test.py >/dev/null

# The recipe is the Makefile's; this adds what it needs.
bench-broker: bench-packages perf-test-jar

##@ Benchmarks of TLS

.PHONY: bench-tls-handshake
bench-tls-handshake: venv ## CPU per heartbeat on a real broker's admin port: a full mutual-TLS handshake each time against keep-alive, plain HTTP for reference.
	$(BIN)/python bench/bench_tls_handshake.py
