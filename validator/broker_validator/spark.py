"""Builds the validator's SparkSession: ``local[N]`` in the CronJob's pod, or client mode on ``k8s://``.

Two ways to run, chosen by the master alone (``--master``):

* ``local[*]`` (the default, ``validator.executors: 0`` in the chart): the driver does all the work
  in its own JVM. Everything binds to 127.0.0.1: nothing outside the pod ever needs to reach it.
* ``k8s://https://<apiserver>``: Spark *client mode*, the driver staying in the CronJob's pod and
  Spark creating its executor pods itself, as checked on the local cluster
  (``SPARK_ON_K8S.md`` of the design folder). The driver listens on its pod IP (downward API), so
  executors reach it without a Service or DNS; its pod is named in
  ``spark.kubernetes.driver.pod.name``, so every executor pod is owned by the driver pod and the
  garbage collector removes them with it, even when the driver dies without ``spark.stop()``.
  Executors mount the store claim at the driver's store path, since tasks carry the driver's paths.

Why no headless Service for the driver: Spark needs one only when executors address the driver by
name (cluster mode creates ``<app>-driver-svc``). Here they get the pod IP, which routes on any
pod network and on the local cluster's 127.x addresses alike. Spark still deletes the executor
pods, their ConfigMap and any driver Service labelled with its application id when it stops
(``deletecollection``), so the chart's Role grants those verbs in executor mode.

Settings are one typed :class:`SparkSettings` handed in (the CLI builds it with
:meth:`SparkSettings.from_env`); nothing below reads the environment (it only sets
``SPARK_LOCAL_IP``, for the JVM that pyspark starts, to the driver's address). What this module does not
do: read records or decide anything (``checks``), stop the session (the caller does, in a
``finally``; :func:`session_for` also registers an exit hook so a k8s session's executor pods are
deleted on any interpreter exit), or support masters other than ``local`` and ``k8s://``.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

APP_NAME: Final = "broker-validator"
LOCAL_HOST: Final = "127.0.0.1"
DRIVER_PORT: Final = 7078
DRIVER_BLOCK_MANAGER_PORT: Final = 7079
"""Fixed, as Spark's cluster mode fixes them, so a NetworkPolicy can admit executors to the driver."""
STORE_VOLUME: Final = "store"
EXECUTOR_CONTAINER: Final = "executor"
EXECUTOR_COMPONENT_LABEL: Final = "validator-executor"

ENV_PREFIX: Final = "VALIDATOR_"
_MEMORY: Final = re.compile(r"^[1-9][0-9]*[kmgtKMGT]?$")
_K8S_MASTER: Final = re.compile(r"^k8s://https?://\S+$")
_LOCAL_MASTER: Final = re.compile(r"^local(\[(\*|[1-9][0-9]*)(,[0-9]+)?\])?$")


class SparkSettingsError(ValueError):
    """A setting the session cannot be built with; the message names the variable and the fix."""


@dataclass(frozen=True)
class SparkSettings:
    """Everything the SparkSession needs besides the master; each field has one env variable.

    The env names are ``VALIDATOR_`` + the field name in capitals (``executor_memory`` ->
    ``VALIDATOR_EXECUTOR_MEMORY``); the chart's CronJob sets them. The fields below
    ``driver_memory`` matter only for a ``k8s://`` master.
    """

    driver_memory: str = "2g"
    """JVM heap of the driver; with ``local[*]`` it holds the executors too."""
    namespace: str | None = None
    """Where executor pods go, and whose BrokerClusters get ``status.ordering`` (downward API)."""
    pod_name: str | None = None
    """The driver's own pod (downward API ``metadata.name``): executors are owned by it."""
    pod_ip: str | None = None
    """The driver's pod IP (downward API ``status.podIP``): spark.driver.host and bindAddress."""
    image: str | None = None
    """The executor image: the validator image itself (its entrypoint's ``executor`` mode)."""
    image_pull_policy: str = "IfNotPresent"
    executors: int = 2
    executor_cores: int = 1
    executor_memory: str = "512m"
    executor_service_account: str | None = None
    """None: the namespace's ``default`` account; executors make no API calls."""
    executor_pod_template: Path | None = None
    """A pod template file for executors (security context, labels); the chart mounts one."""
    store_claim: str | None = None
    """The message-log store's claim, mounted into each executor at ``store_mount``."""
    store_mount: str | None = None
    """The driver's store path: tasks carry the driver's paths, so executors mount it there."""
    extra_conf: Mapping[str, str] = field(default_factory=dict)
    """Any other Spark properties (``VALIDATOR_SPARK_CONF``: ``key=value`` pairs, comma separated)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SparkSettings:
        """Settings from ``VALIDATOR_*`` variables (``os.environ`` by default); unset means default."""
        env = os.environ if environ is None else environ
        defaults = cls()

        def text(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name.upper(), "").strip()
            return value or None

        def number(name: str, default: int, minimum: int) -> int:
            raw = text(name)
            if raw is None:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise SparkSettingsError(
                    f"{ENV_PREFIX}{name.upper()}={raw!r} is not a whole number"
                ) from None
            if value < minimum:
                raise SparkSettingsError(f"{ENV_PREFIX}{name.upper()}={value} must be at least {minimum}")
            return value

        def memory(name: str, default: str) -> str:
            raw = text(name) or default
            if not _MEMORY.match(raw):
                raise SparkSettingsError(
                    f"{ENV_PREFIX}{name.upper()}={raw!r} is not a JVM memory size such as 512m or 2g"
                )
            return raw

        template = text("executor_pod_template")
        return cls(
            driver_memory=memory("driver_memory", defaults.driver_memory),
            namespace=text("namespace"),
            pod_name=text("pod_name"),
            pod_ip=text("pod_ip"),
            image=text("image"),
            image_pull_policy=text("image_pull_policy") or defaults.image_pull_policy,
            executors=number("executors", defaults.executors, 1),
            executor_cores=number("executor_cores", defaults.executor_cores, 1),
            executor_memory=memory("executor_memory", defaults.executor_memory),
            executor_service_account=text("executor_service_account"),
            executor_pod_template=Path(template) if template else None,
            store_claim=text("store_claim"),
            store_mount=text("store_mount"),
            extra_conf=_parse_conf(text("spark_conf")),
        )


def _parse_conf(raw: str | None) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in (raw or "").split(","):
        if not pair.strip():
            continue
        key, separator, value = pair.partition("=")
        if not separator or not key.strip().startswith("spark."):
            raise SparkSettingsError(
                f"{ENV_PREFIX}SPARK_CONF entry {pair!r} must be spark.<property>=<value>"
            )
        conf[key.strip()] = value.strip()
    return conf


def _common_conf(settings: SparkSettings) -> dict[str, str]:
    """What every session gets: quiet, no UI, UTC, the driver's Python for the tasks."""
    return {
        "spark.app.name": APP_NAME,
        "spark.driver.memory": settings.driver_memory,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
        # Python workers (driver-local or on executors) run the interpreter the driver runs: the
        # same path in the image, and this host's venv on the local cluster.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }


def local_conf(cores: int | str, settings: SparkSettings | None = None) -> dict[str, str]:
    """The properties of a ``local[cores]`` session (``"*"``: every core of the pod)."""
    settings = settings or SparkSettings()
    return {
        **_common_conf(settings),
        "spark.master": f"local[{cores}]",
        # The checks split the segments into one task per core (checks.TASKS_PER_CORE).
        "spark.default.parallelism": str(os.cpu_count() or 1 if cores == "*" else cores),
        # Loopback only: in local mode nothing outside this process needs the driver's ports.
        "spark.driver.host": LOCAL_HOST,
        "spark.driver.bindAddress": LOCAL_HOST,
        **settings.extra_conf,
    }


def kubernetes_conf(master: str, settings: SparkSettings) -> dict[str, str]:
    """The properties of a client-mode session on ``master`` (``k8s://https://...``).

    Raises :class:`SparkSettingsError` naming every missing variable: a driver that cannot name its
    pod, address or image would start executors that never reach it.
    """
    if not _K8S_MASTER.match(master):
        raise SparkSettingsError(f"master {master!r} is not k8s://https://<apiserver host>:<port>")
    required = {
        "namespace": settings.namespace,
        "pod_name": settings.pod_name,
        "pod_ip": settings.pod_ip,
        "image": settings.image,
    }
    missing = [ENV_PREFIX + name.upper() for name, value in required.items() if not value]
    if (settings.store_claim is None) != (settings.store_mount is None):
        missing.append(f"{ENV_PREFIX}STORE_CLAIM and {ENV_PREFIX}STORE_MOUNT (both or neither)")
    if missing:
        raise SparkSettingsError(
            f"a {master} session needs {', '.join(missing)}: the chart's CronJob sets them "
            "(namespace, pod name and IP from the downward API)"
        )
    conf = {
        **_common_conf(settings),
        "spark.master": master,
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": str(settings.namespace),
        "spark.kubernetes.driver.pod.name": str(settings.pod_name),
        "spark.driver.host": str(settings.pod_ip),
        "spark.driver.bindAddress": str(settings.pod_ip),
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(DRIVER_BLOCK_MANAGER_PORT),
        "spark.kubernetes.container.image": str(settings.image),
        "spark.kubernetes.container.image.pullPolicy": settings.image_pull_policy,
        "spark.executor.instances": str(settings.executors),
        "spark.executor.cores": str(settings.executor_cores),
        "spark.executor.memory": settings.executor_memory,
        # Known before the executors register, unlike Spark's own default (cores registered so far).
        "spark.default.parallelism": str(settings.executors * settings.executor_cores),
        "spark.dynamicAllocation.enabled": "false",
        "spark.kubernetes.executor.label.app.kubernetes.io/component": EXECUTOR_COMPONENT_LABEL,
        # The store claim is a named, shared claim: Spark must neither create nor own claims.
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
    }
    if settings.executor_service_account:
        conf["spark.kubernetes.authenticate.executor.serviceAccountName"] = settings.executor_service_account
    if settings.executor_pod_template is not None:
        conf["spark.kubernetes.executor.podTemplateFile"] = str(settings.executor_pod_template)
        conf["spark.kubernetes.executor.podTemplateContainerName"] = EXECUTOR_CONTAINER
    if settings.store_claim and settings.store_mount:
        volume = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{STORE_VOLUME}"
        conf[f"{volume}.options.claimName"] = settings.store_claim
        conf[f"{volume}.mount.path"] = settings.store_mount
        # Executors only read segments; the checkpoint and reports are the driver's to write.
        conf[f"{volume}.mount.readOnly"] = "true"
    conf.update(settings.extra_conf)
    return conf


def _build(conf: Mapping[str, str]) -> SparkSession:
    # spark-submit's JVM, started by pyspark with this process's environment, otherwise picks a
    # "local" address from the host's interfaces for anything not pinned by the properties (and
    # warns that the hostname resolves to loopback). Pin it to the driver's own address.
    os.environ.setdefault("SPARK_LOCAL_IP", conf["spark.driver.bindAddress"])
    # The checks run in Python tasks, which pyspark starts with $PYSPARK_PYTHON (default: the
    # first python3 on PATH, which may lack this package), not with spark.pyspark.python.
    os.environ.setdefault("PYSPARK_PYTHON", conf["spark.pyspark.python"])
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def local_session(cores: int = 2, settings: SparkSettings | None = None) -> SparkSession:
    """A ``local[cores]`` session for tests and small stores (2 GiB driver heap by default)."""
    if cores < 1:
        raise SparkSettingsError(f"local_session cores ({cores}) must be at least 1")
    return _build(local_conf(cores, settings))


def session_for(master: str | None, settings: SparkSettings) -> SparkSession:
    """The session for ``--master``: None or ``local[...]`` runs in-process, ``k8s://`` with executor pods."""
    if master is None or master.strip() == "":
        return _build(local_conf("*", settings))
    master = master.strip()
    local = _LOCAL_MASTER.match(master)
    if local:
        cores = local.group(2) or "1"  # plain "local" is one core
        conf = local_conf(cores if cores == "*" else int(cores), settings)
        conf["spark.master"] = master  # as given, with its task retries if any
        return _build(conf)
    if master.startswith("k8s://"):
        session = _build(kubernetes_conf(master, settings))
        # Executor pods are deleted by spark.stop(); the exit hook covers a caller that returns or
        # raises without stopping (the owner reference covers a driver that is killed).
        atexit.register(session.stop)
        return session
    raise SparkSettingsError(
        f"master {master!r} is not supported: use local[*], local[N] or k8s://https://<apiserver>:<port>"
    )
