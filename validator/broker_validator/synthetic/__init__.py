"""Synthetic message-log stores: realistic broker histories with exactly known anomalies.

The validator's tests and ``make bench-validator`` need stores far larger than a real run produces
on one machine (ten million records), with a known verdict. :func:`generate_store` writes one:
per cluster, terms of its brokers (``activated`` / ``deactivated``), epochs rising by one per
failover, and per message in both directions the records a broker writes (``accepted``,
``forwarded`` attempt 1, ``delivered``, ``confirmed``), byte for byte as
:mod:`broker_service.message_log_writer` formats them (schema field order, no spaces), into
``<store>/<cluster>/<broker>/<segment>.<sha256>.jsonl`` named by
:func:`broker_contracts.message_log.segment_name` and sealed with its checksum as brokers seal
theirs. It lives in the package, not in ``tests/``, because ``bench/`` uses it too, and what
users run never imports the test suite.

How the history looks, and why:

* Traffic comes in bursts separated by idle time, so a history of any size spans at least
  :data:`MIN_SPAN_SECONDS` (older than the settle horizon, where ``lost`` is judged) while each
  burst is short. A burst is a pipeline of bundles per direction: at each tick the broker logs
  ``accepted`` for bundle *k*, ``forwarded`` for *k-1*, ``delivered`` for *k-2* and ``confirmed``
  for *k-3*, one timestamp per logged bundle (a broker writes a bundle's records in one call),
  ticks milliseconds apart; every broker's file is in time order. A bundle carries
  :data:`PER_STREAM` consecutive seqs of each of up to 25 streams (bench-broker's shape).
* A planned failover drains the pipeline, logs ``deactivated``, and the next broker logs
  ``activated`` with the next epoch. A crash stops a burst in the middle without
  ``deactivated``: the bundle the broker had forwarded (the target took it, the ``delivered``
  record never made it to the log) and the unconfirmed ones are resent to the next active, which
  accepts them again; the target answers ``duplicate`` for what it already had, logged as
  ``deduplicated``, and takes the rest. So a clean store has ``crashed-term`` and
  ``deduplicated`` findings (both not violations) and no violation at all. ``deduplicated`` counts
  messages as the README defines it: a ``deduplicated`` record and no ``delivered`` record; the
  resent messages whose ``delivered`` record did reach the log are not counted.
* The history ends drained: nothing is in flight unless injected.

``inject`` adds exact numbers of anomalies, each instance producing one finding of its class and
nothing else, on distinct streams where there are enough, away from crashes (see
:data:`INJECTABLE` and :class:`~.manifest.InjectedAnomaly`). The returned :class:`GeneratedStore` is the
manifest: records, segments, messages per cluster and direction, failovers, the expected count of
every anomaly class (``expected``) and where each injected instance is. Save it beside the store,
never inside (the validator reports any other file in the store as ``foreign-file``).
:func:`extend_store` continues a history (same clusters, brokers and streams, later segments), for
incremental runs.

Speed: lines are built as the broker's writer builds them, a per-bundle ``head``/``tail`` around
cached per-message fragments joined in C, and written in blocks of about a megabyte; ten million
records (2.4 GB) take about 12 s on this project's machine, most of it the kernel writing. What it
deliberately does not model: payloads (the log has none), retries other than a poison message's,
replays of held messages, and clock skew between brokers.

The package, one job per module, in the order a part is made:

* :mod:`.manifest`: :data:`INJECTABLE` and the manifest types (:class:`GeneratedStore`);
* :mod:`.plan`: per cluster, the bursts, their bundles, failovers and crashes, and the state a
  later part continues from;
* :mod:`.placement`: where each injected instance goes (marks on the planned bundles);
* :mod:`.history`: one cluster's history written from its plan (the pipeline, failovers, crashes
  and their resends);
* :mod:`.segments`: the segment and store writers and the clock (the bytes, and the speed);
* :mod:`.generate`: :func:`generate_store`, :func:`extend_store` and the malformed lines;
* :mod:`.cli` (run by ``__main__``): ``python -m broker_validator.synthetic --store DIR
  --records N [--inject lost=2 ...]``.

The names below are the public surface; the modules' other names are the package's own.
"""

from broker_validator.synthetic.cli import main
from broker_validator.synthetic.generate import extend_store, generate_store
from broker_validator.synthetic.manifest import INJECTABLE, GeneratedStore

__all__ = ["INJECTABLE", "GeneratedStore", "extend_store", "generate_store", "main"]
