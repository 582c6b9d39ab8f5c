"""The validator image's entrypoint: ``driver`` runs the CLI, ``executor`` runs a Spark executor JVM.

One image serves both roles, as Apache Spark's own image does (its ``entrypoint.sh``):

* ``driver [ARGS...]``, no argument, or arguments starting with ``-``: ``broker-validator ARGS``,
  what the CronJob's pod runs. With ``--master k8s://...`` that driver asks Kubernetes for executor
  pods of this same image.
* ``executor``: what Spark puts in each executor pod (the single argument ``executor`` and the
  ``SPARK_*`` environment of ``BasicExecutorFeatureStep``). It starts
  ``org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend`` the way Spark's script does:
  ``SPARK_JAVA_OPT_<n>`` in index order as JVM options, ``-Xms``/``-Xmx`` from
  ``SPARK_EXECUTOR_MEMORY``, the class path ``$SPARK_CONF_DIR:$SPARK_CLASSPATH:<pyspark>/jars/*``,
  and ``--driver-url``, ``--executor-id``, ``--cores``, ``--app-id``, ``--hostname`` (the pod IP),
  ``--resourceProfileId`` and ``--podName`` from their variables.
* anything else is executed as a command (``bash`` for a look inside the image), as Spark's does.

Each role replaces this process (``exec``), so the JVM or the CLI receives the pod's signals
directly. Why Python rather than a shell script: ``python -m broker_validator.entrypoint`` runs the
same in the image and outside it (a local install has no image file system to put a script on),
and the argv it builds is unit-testable. What it
does not do: Spark's ``nss_wrapper`` passwd entry for arbitrary UIDs (the image has a fixed user),
Kerberos or Hadoop configuration, or IPv6 pod addresses.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

CLI: Final = "broker-validator"
EXECUTOR_BACKEND: Final = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
EXIT_BAD_ENVIRONMENT: Final = 2  # the CLI's "could not validate"

# (flag of KubernetesExecutorBackend, variable Spark sets in the executor pod)
EXECUTOR_ARGUMENTS: Final = (
    ("--driver-url", "SPARK_DRIVER_URL"),
    ("--executor-id", "SPARK_EXECUTOR_ID"),
    ("--cores", "SPARK_EXECUTOR_CORES"),
    ("--app-id", "SPARK_APPLICATION_ID"),
    ("--hostname", "SPARK_EXECUTOR_POD_IP"),
    ("--resourceProfileId", "SPARK_RESOURCE_PROFILE_ID"),
    ("--podName", "SPARK_EXECUTOR_POD_NAME"),
)
_JAVA_OPT: Final = re.compile(r"^SPARK_JAVA_OPT_([0-9]+)$")


class EntrypointError(RuntimeError):
    """The executor's environment lacks what Spark should have set; the message names it."""


def spark_home(env: Mapping[str, str]) -> Path:
    """``SPARK_HOME``, or the installed pyspark package (it carries ``jars/`` and ``bin/``)."""
    if env.get("SPARK_HOME"):
        return Path(env["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise EntrypointError("pyspark is not installed and SPARK_HOME is not set: no Spark jars to run")
    return Path(spec.origin).parent


def java_binary(env: Mapping[str, str]) -> str:
    if env.get("JAVA_HOME"):
        return str(Path(env["JAVA_HOME"]) / "bin" / "java")
    found = shutil.which("java", path=env.get("PATH"))
    if found is None:
        raise EntrypointError(
            "no java on PATH and JAVA_HOME is not set: the executor needs a Java 17 runtime"
        )
    return found


def java_options(env: Mapping[str, str]) -> list[str]:
    """``SPARK_JAVA_OPT_0..n`` in numeric index order (``_10`` after ``_9``), as Spark's script sorts."""
    indexed = [
        (int(match.group(1)), value) for name, value in env.items() if (match := _JAVA_OPT.match(name))
    ]
    return [value for _, value in sorted(indexed)]


def executor_classpath(env: Mapping[str, str], home: Path) -> str:
    parts = [
        env.get("SPARK_CONF_DIR", ""),
        env.get("SPARK_CLASSPATH", ""),
        env.get("SPARK_EXTRA_CLASSPATH", ""),
    ]
    parts += [str(home / "jars" / "*"), env.get("SPARK_DIST_CLASSPATH", "")]
    return ":".join(part for part in parts if part)


def executor_argv(env: Mapping[str, str]) -> list[str]:
    """The executor JVM's argv from the pod's environment; raises naming every missing variable."""
    missing = [name for _, name in EXECUTOR_ARGUMENTS if not env.get(name)]
    missing += [] if env.get("SPARK_EXECUTOR_MEMORY") else ["SPARK_EXECUTOR_MEMORY"]
    if missing:
        raise EntrypointError(
            f"executor mode needs {', '.join(missing)}; Spark sets them in the executor pods it creates "
            "(run `driver` to validate)"
        )
    memory = env["SPARK_EXECUTOR_MEMORY"]
    argv = [java_binary(env), *java_options(env), f"-Xms{memory}", f"-Xmx{memory}"]
    argv += ["-cp", executor_classpath(env, spark_home(env)), EXECUTOR_BACKEND]
    for flag, name in EXECUTOR_ARGUMENTS:
        argv += [flag, env[name]]
    return argv


def executor_env(env: Mapping[str, str]) -> dict[str, str]:
    """The pod's environment plus ``SPARK_HOME`` (its Python workers' path is built from it) and
    ``SPARK_LOCAL_IP``, the pod IP, so the JVM never picks an address of its own."""
    executor = {**env, "SPARK_HOME": str(spark_home(env))}
    executor.setdefault("SPARK_LOCAL_IP", env.get("SPARK_EXECUTOR_POD_IP", ""))
    return executor


def command_for(args: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """What to exec for the container's arguments: (argv, environment)."""
    if not args or args[0] == "driver":
        return [CLI, *args[1:]], dict(env)
    if args[0].startswith("-"):
        return [CLI, *args], dict(env)
    if args[0] == "executor":
        return executor_argv(env), executor_env(env)
    return list(args), dict(env)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        command, env = command_for(args, os.environ)
    except EntrypointError as error:
        print(f"broker-validator entrypoint: {error}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_ENVIRONMENT) from None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:
        print(f"broker-validator entrypoint: cannot run {command[0]!r}: {error}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_ENVIRONMENT) from None


if __name__ == "__main__":
    main()
