"""``kubectl-broker``: arguments, kubeconfig flags, output format and exit codes; the plugin's entry point.

kubectl runs ``kubectl-broker`` with the words after ``kubectl broker``, so this is an ordinary
argparse program. The kubeconfig flags are kubectl's (``--kubeconfig``, ``--context``,
``-n/--namespace``, ``-A/--all-namespaces`` for ``status``) and are accepted before or after the
subcommand. Output is text for people or ``-o json`` for scripts (documented, stable documents).

Exit codes (``errors.py``): 0 done, 1 the operation failed, 2 bad usage or a name that does not
exist. Errors go to stderr as ``error: <sentence>``, never as a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker_operator.kubectl_plugin import ca_export, held, report, status_view, switchover
from broker_operator.kubectl_plugin.admin import DEFAULT_TIMEOUT_SECONDS
from broker_operator.kubectl_plugin.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PluginError
from broker_operator.kubectl_plugin.kube import Kube, connect

PROG = "kubectl broker"
EPILOG = (
    "exit codes: 0 done; 1 the operation failed (API or RBAC refusal, broker unreachable or refusing, "
    "switchover not completed); 2 bad usage, kubeconfig, or a cluster or broker that does not exist. "
    "See docs/kubectl-plugin.md."
)


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with kubectl's ``error:`` prefix (argparse's own code is 2 as well)."""

    def error(self, message: str) -> Any:  # argparse's signature returns NoReturn
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"error: {message}\n")


def _connection_flags() -> _Parser:
    # SUPPRESS defaults: a flag given before the subcommand is not reset by the subparser's default.
    flags = _Parser(add_help=False)
    flags.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="path to the kubeconfig file")
    flags.add_argument("--context", default=argparse.SUPPRESS, help="the kubeconfig context to use")
    flags.add_argument(
        "-n", "--namespace", default=argparse.SUPPRESS, help="namespace (default: the context's)"
    )
    flags.add_argument(
        "-o", "--output", choices=["text", "json"], default=argparse.SUPPRESS, help="output format"
    )
    return flags


def build_parser() -> argparse.ArgumentParser:
    common = _connection_flags()
    about = "Look after BrokerClusters: status, switchover, held messages, reports, the CA for SAP."
    parser = _Parser(prog=PROG, description=about, epilog=EPILOG, parents=[common])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    status = commands.add_parser(
        "status", parents=[common], help="a cluster's brokers and state; all clusters without a name"
    )
    status.add_argument("cluster", nargs="?", help="BrokerCluster name; omitted: one line per cluster")
    status.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace (without CLUSTER)"
    )
    status.add_argument("--no-held", action="store_true", help="do not ask the brokers for held counts")

    move = commands.add_parser(
        "switchover", parents=[common], help="make BROKER the active broker and wait for it"
    )
    move.add_argument("cluster")
    move.add_argument("broker")
    move.add_argument(
        "--timeout", type=_seconds, default=60.0, help="seconds to wait for BROKER to be active (60)"
    )
    move.add_argument(
        "--wait", type=_boolean, default=True, help="wait for the move (true) or only request it"
    )

    held_parser = commands.add_parser("held", parents=[common], help="list, replay or discard held messages")
    actions = held_parser.add_subparsers(dest="action", required=True, parser_class=_Parser)
    where = _Parser(add_help=False)
    where.add_argument("cluster")
    where.add_argument("--broker", help="ask this broker (default: the active one)")
    where.add_argument("--url", help="the broker's SOAP URL, e.g. through kubectl port-forward")
    where.add_argument(
        "--timeout", type=_seconds, default=DEFAULT_TIMEOUT_SECONDS, help="seconds per SOAP call"
    )
    listing = actions.add_parser("list", parents=[common, where], help="held messages of a broker")
    listing.add_argument("--all-brokers", action="store_true", help="ask every broker of the cluster")
    listing.add_argument("--stream", help="only this stream")
    for action, text in (
        ("replay", "deliver a held message again"),
        ("discard", "drop a held message for good"),
    ):
        release = actions.add_parser(action, parents=[common, where], help=text)
        release.add_argument("direction", choices=list(held.DIRECTIONS))
        release.add_argument("stream")
        release.add_argument("seq", type=int)

    verdict = commands.add_parser("report", parents=[common], help="the ordering validator's latest verdict")
    verdict.add_argument("cluster")
    verdict.add_argument("--show", action="store_true", help="print report.json too")
    verdict.add_argument(
        "--claim-dir", type=Path, help="where the report's claim (pvc/<claim>) is mounted here"
    )

    ca = commands.add_parser(
        "ca", parents=[common], help="the CA the SAP backend must trust (for STRUST or the PI/PO keystore)"
    )
    ca.add_argument("cluster")
    ca.add_argument(
        "--format", choices=list(ca_export.FORMATS), default="pem",
        help="pem (Base64, the default) or der (binary .cer; needs --file, one file per CA)",
    )  # fmt: skip
    ca.add_argument("--file", type=Path, help="write here instead of stdout")
    return parser


def _seconds(text: str) -> float:
    value = float(text.removesuffix("s"))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, not {text!r}")


def _emit(args: argparse.Namespace, document: Any, text: str) -> None:
    print(json.dumps(document, indent=2, sort_keys=True) if _json(args) else text)


def _json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "text") == "json"


def run_status(kube: Kube, args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    if args.cluster is None:
        summaries = [status_view.cluster_summary(b, now) for b in kube.list_clusters(args.all_namespaces)]
        text = status_view.render_cluster_list(summaries, now, with_namespace=args.all_namespaces)
        _emit(args, {"schema": "kubectl-broker/status-list/v1", "clusters": summaries}, text)
        return EXIT_OK
    if args.all_namespaces:
        raise PluginError("-A/--all-namespaces lists every cluster; name no CLUSTER with it", EXIT_USAGE)
    body = kube.get_cluster(args.cluster)
    counts = None if args.no_held else held.held_counts(kube, body)
    document = status_view.cluster_document(body, counts, now)
    _emit(args, document, status_view.render_cluster(document, now))
    return EXIT_OK


def run_switchover(kube: Kube, args: argparse.Namespace) -> int:
    say = (lambda line: print(line, file=sys.stderr)) if _json(args) else print
    closing = switchover.switchover(
        kube, args.cluster, args.broker, timeout=args.timeout, wait=args.wait, say=say
    )
    body = kube.get_cluster(args.cluster)
    status = status_view.status_of(body)
    document = {"schema": "kubectl-broker/switchover/v1", "cluster": args.cluster, "broker": args.broker,
                "active": status.get("active"), "epoch": status.get("epoch"), "message": closing}  # fmt: skip
    _emit(args, document, closing)
    return EXIT_OK


def run_held(kube: Kube, args: argparse.Namespace) -> int:
    body = kube.get_cluster(args.cluster)
    if args.action == "list":
        found = held.list_held(
            kube, body, broker=args.broker, all_brokers=args.all_brokers, url=args.url,
            stream=args.stream, timeout=args.timeout,
        )  # fmt: skip
        asked = (
            [a.name for a in kube.broker_addresses(body)]
            if args.all_brokers
            else [args.broker or str(status_view.status_of(body).get("active"))]
        )
        document = held.held_document(args.cluster, kube.namespace, found)
        _emit(args, document, held.render_held(found, asked, datetime.now(UTC)))
        return EXIT_OK
    broker, message = held.release_held(
        kube, body, action=args.action, direction=args.direction, stream=args.stream, seq=args.seq,
        broker=args.broker, url=args.url, timeout=args.timeout,
    )  # fmt: skip
    done = "replayed" if args.action == "replay" else "discarded"
    document = {"schema": "kubectl-broker/held-action/v1", "cluster": args.cluster, "broker": broker,
                "action": args.action, "direction": args.direction, "stream": args.stream, "seq": args.seq,
                "message": message}  # fmt: skip
    _emit(args, document, f"{done} {args.direction} {args.stream} seq {args.seq} on {broker}: {message}")
    return EXIT_OK


def run_report(kube: Kube, args: argparse.Namespace) -> int:
    body = kube.get_cluster(args.cluster)
    document, problem = report.report_document(body, args.claim_dir, args.show)
    _emit(args, document, report.render_report(document, datetime.now(UTC)))
    if problem is not None:
        print(f"error: cannot show the report: {problem}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def run_ca(kube: Kube, args: argparse.Namespace) -> int:
    body = kube.get_cluster(args.cluster)
    where, cas = ca_export.read_cas(kube, body)
    if args.format == "der" and args.file is None:
        raise PluginError("--format der writes binary files: name one with --file ca.cer", EXIT_USAGE)
    summary = ca_export.render_summary(where, cas)
    if _json(args):
        document = {"schema": ca_export.SCHEMA, "cluster": args.cluster, "namespace": kube.namespace,
                    "source": where, "certificates": [ca.document() for ca in cas]}  # fmt: skip
        print(json.dumps(document, indent=2, sort_keys=True))
        return EXIT_OK
    if args.format == "der":
        written = ca_export.write_der(cas, args.file)
        print(summary, file=sys.stderr)
        print("\n".join(f"wrote {path}" for path in written), file=sys.stderr)
    elif args.file is not None:
        args.file.write_text("".join(ca.pem for ca in cas), encoding="ascii")
        print(summary, file=sys.stderr)
        print(f"wrote {args.file}", file=sys.stderr)
    else:
        # The PEM alone on stdout (redirectable into a file); what it is, on stderr.
        print(summary, file=sys.stderr)
        sys.stdout.write("".join(ca.pem for ca in cas))
    return EXIT_OK


COMMANDS = {
    "status": run_status,
    "switchover": run_switchover,
    "held": run_held,
    "report": run_report,
    "ca": run_ca,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        kube = connect(
            getattr(args, "kubeconfig", None),
            getattr(args, "context", None),
            getattr(args, "namespace", None),
        )
        return COMMANDS[args.command](kube, args)
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        # `kubectl broker status | head`: the reader has gone, which is no error worth a traceback;
        # stdout is pointed at /dev/null so that the interpreter's final flush stays quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
