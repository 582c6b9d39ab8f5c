# What the chart's monitoring tests run (issue 43): promtool, from Debian's prometheus package,
# checks and unit-tests the PrometheusRule the chart renders (tests/monitoring). Debian's package
# also brings the prometheus server, which the later real-Prometheus e2e will run; its system
# service is not started (hack/without-service-start.sh): the tests start their own.

MONITORING_PACKAGES := promtool=prometheus

TEST_PREREQS += monitoring-packages

##@ Monitoring

.PHONY: monitoring-packages
monitoring-packages: ## Install Debian's prometheus (prometheus, promtool) with apt-get, its system service not started; no-op when there.
	@hack/without-service-start.sh hack/host-packages.sh $(MONITORING_PACKAGES)

.PHONY: monitoring-test
monitoring-test: venv tools monitoring-packages ## The chart's alerts (promtool check/test rules on the rendered PrometheusRule), dashboard queries and runbooks: tests/monitoring.
	$(PYTEST) tests/monitoring
