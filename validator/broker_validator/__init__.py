"""The ordering validator: proves, from the brokers' message logs, that no message was lost,
delivered twice or reordered, and that no two brokers of one cluster were active at once.

Layers, each a module with one job:

* :mod:`broker_validator.report_schema`: the versioned ``report.json`` contract (TypedDicts) and the
  anomaly classes, which of them fail a run;
* :mod:`broker_validator.store`: finds closed segments in the store, tells foreign and empty files
  apart, and keeps the checkpoint (what was processed, per-stream state) atomically;
* :mod:`broker_validator.checks`: the checks as two passes of Spark tasks over the new segments,
  with the decisions that span segments made on the driver; the tasks run
  :mod:`broker_validator.segment_pass` on each segment, which parses with
  :mod:`broker_validator.segment_reader` and judges messages with :mod:`broker_validator.messages`;
* :mod:`broker_validator.fold`: folds what the checks found into the carried state;
* :mod:`broker_validator.report_html`: the self-contained HTML report, with the timeline picture
  drawn by :mod:`broker_validator.report_timeline`;
* :mod:`broker_validator.status`: writes each BrokerCluster's ``status.ordering``;
* :mod:`broker_validator.spark`: builds the SparkSession for ``local[*]`` or a ``k8s://`` master;
* :mod:`broker_validator.cli`: ``broker-validator --store DIR --report-dir DIR [--full] [--master URL]``;
* :mod:`broker_validator.synthetic`: generated message-log histories with injected anomalies, for
  the tests and ``make bench-validator``.

What it deliberately is not: a live monitor. It reads closed segments only, so it sees a broker's
records at most one segment bound late, and it judges a message lost only once it is older than a
settle horizon.
"""
