"""Simulators of the SAP backend and of the cloud service, for tests, benchmarks and the demo."""
