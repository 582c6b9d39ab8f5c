"""The broker's settings: one typed object, read once from the command line and the environment.

Every flag of ``broker-service`` also reads an environment variable (the pod
spec sets env vars, tests pass flags); a flag wins over its variable. The
result is a frozen :class:`BrokerSettings` that the rest of the broker receives
as an argument. Nothing else in the package reads the environment, so a test can
build settings directly and a reader finds every knob here.

This module does not validate reachability of URLs or create directories; the
broker does that when it starts and says which setting was wrong.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from broker_contracts import environment
from broker_contracts.environment import BROKER_ADMIN_PORT, BROKER_LEASE_SECONDS, BROKER_MAX_LEASE_SECONDS
from broker_contracts.logs import DEFAULT_LOG_SETTINGS, LogSettings, LogSettingsError, parse_log_settings
from broker_contracts.redact import redact
from broker_contracts.soap import BUNDLE_MAX_BYTES, BUNDLE_MAX_MESSAGES, OPERATOR_REQUEST_MAX_BYTES
from broker_contracts.token_verifier import VerifierError, parse_verifier
from broker_service.target_credentials import TargetCredentialError, relay_target
from broker_service.tls_settings import (
    DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    ListenerTlsSettings,
    TlsSettingsError,
    parse_listener_tls,
    parse_reload_seconds,
    parse_upstream_ca,
)


class PoisonPolicy(StrEnum):
    """What happens to a message that failed ``maxDeliveries`` times (see ARCHITECTURE.md)."""

    BLOCK_STREAM = "BlockStream"  # the stream stops at the poison message until replay or discard
    HOLD = "Hold"  # the message is parked on the hold queue and the stream goes on


class SettingsError(ValueError):
    """A setting that cannot be used; the text names the flag, its variable and the value."""


@dataclass(frozen=True)
class BrokerSettings:
    host: str = "0.0.0.0"
    port: int = 8080
    # A second port for the operator's calls (Heartbeat, ListHeld/ReplayHeld/DiscardHeld, and
    # /metrics too), so that a NetworkPolicy, which sees ports and not SOAP operations, can admit
    # them from the operator alone while SendMessages stays open to the backend on ``port``.
    # None: one port serves everything, as before (the local runner, tests, external endpoints).
    admin_port: int | None = None
    name: str = "broker"
    cluster: str = "cluster"
    account: str = ""
    company: str = ""
    data_dir: Path = Path("/var/lib/broker")
    message_log_dir: Path | None = None
    backend_url: str = ""
    cloud_url: str = ""
    # Mounted Secret keys the broker presents to each target (target_credentials.py): a `token`
    # (Bearer) or `username` and `password` (Basic); the way to give them a credential without
    # putting it in a URL.
    backend_credentials_dir: Path | None = None
    cloud_credentials_dir: Path | None = None
    # Verifiers ("sha256:<hex>", broker_contracts.token_verifier), never the tokens themselves:
    # the operator's token opens Heartbeat and the admin operations, the backend's SendMessages.
    token_verifier: str = ""
    backend_token_verifier: str = ""
    # The files they were read from (None: given as a value in the environment, never re-read).
    # The broker re-reads a file when it changes and accepts the token it replaced for
    # token_grace_seconds more (credentials.py: a rotated Secret reaches pods and the operator
    # at different instants).
    token_verifier_file: Path | None = None
    backend_token_verifier_file: Path | None = None
    token_grace_seconds: float = 30.0
    lease_seconds: float = 10.0  # the CRD's heartbeat.leaseSeconds default
    # The longest lease a handover renewal (WSDL leaseSeconds, from a stopping operator) may grant;
    # None: lease_seconds, i.e. no handover lengthens the lease. The lease watcher, the margin and
    # the stall rule stay lease_seconds' (docs/broker.md, "Handover renewal").
    max_lease_seconds: float | None = None
    max_deliveries: int = 5
    on_poison: PoisonPolicy = PoisonPolicy.BLOCK_STREAM
    # TLS on both listeners (tls_settings.py, docs/broker.md "TLS"); None: plain HTTP, as before.
    tls: ListenerTlsSettings | None = None
    # How often the TLS files are read again: the listeners' (also tls.reload_seconds) and the
    # upstream bundle, which is followed with or without TLS on the listeners (upstream_tls.py).
    tls_reload_seconds: float = 10.0
    # The CA bundle https:// backend and cloud URLs are verified against; None: the system's store.
    upstream_ca_file: Path | None = None
    # Log format and level (broker_contracts.logs); in a pod, the operator's own.
    log: LogSettings = DEFAULT_LOG_SETTINGS
    # Tuning knobs below have no env var on purpose: the fixed CLI of the pod spec
    # does not name them; tests and benchmarks pass them as flags.
    # Request limits (docs/broker.md, "Request limits"): every request is parsed on the event loop
    # that answers the operator's heartbeats, and every connection holds memory and a task, so each
    # is bounded before the expensive work. The byte and message limits are the contract's.
    body_limit_bytes: int = BUNDLE_MAX_BYTES  # the backend's SendMessages
    operator_body_limit_bytes: int = OPERATOR_REQUEST_MAX_BYTES  # Heartbeat and the admin calls
    bundle_max_messages: int = BUNDLE_MAX_MESSAGES
    # A connection must complete a request's headers this long after it opened or after its last
    # response (aiohttp's keep-alive timer), or it is closed; on both ports. It exceeds the
    # operator's client keep-alive (30 s; the operator calls the main port when there is no admin
    # port) and the backend simulator's (15 s), so that the client, not the broker, closes idle ones.
    header_timeout_seconds: float = 40.0
    body_timeout_seconds: float = 15.0  # to receive a whole body once its headers arrived
    max_connections: int = 128  # per listener; more are closed as they open
    forward_bundle_max: int = 2000
    forward_concurrency: int = 4
    poll_max: int = 500
    poll_idle_seconds: float = 0.2
    retry_base_seconds: float = 0.05
    retry_max_seconds: float = 2.0
    relay_timeout_seconds: float = 5.0
    # The most of one backend or cloud reply the broker reads; a cloud poll of poll_max messages
    # is far below it. A target that sends more gets a retried error, not the broker's memory.
    relay_reply_limit_bytes: int = 16 * 1024 * 1024
    journal_rotate_bytes: int = 64 * 1024 * 1024
    segment_max_bytes: int = 32 * 1024 * 1024
    segment_max_seconds: float = 30.0
    drain_seconds: float = 5.0
    token_check_seconds: float = 1.0  # at most this often a credential file is stat-ed per request

    @property
    def lease_margin_seconds(self) -> float:
        """How late a self-fence may be and still be safe: ``max(0.25, 0.1 * lease_seconds)``.

        The operator activates another broker only after (outcome of its last ``active=true``)
        + ``leaseSeconds`` + this margin, with the same formula on its side. So a broker whose
        event loop was stalled longer than the margin (SIGSTOP, VM pause, long GC) cannot know
        that the operator has not moved on meanwhile, and must fence itself rather than act on
        anything that waited out the stall; that is the broker's stall limit. One derivation,
        here, so the lease watcher, the heartbeat and ``SendMessages`` agree.
        """
        return max(0.25, 0.1 * self.lease_seconds)

    @property
    def max_lease_cap_seconds(self) -> float:
        """The cap on a handover renewal's lease: ``max_lease_seconds``, or the lease when unset."""
        return self.lease_seconds if self.max_lease_seconds is None else self.max_lease_seconds

    @property
    def lease_tick_seconds(self) -> float:
        """How often the lease watcher runs: ``min(0.1, lease_seconds / 10)``."""
        return min(0.1, self.lease_seconds / 10)

    @property
    def pair_fixed(self) -> bool:
        """Whether bundles must name this broker's (account, company); unset means any pair."""
        return bool(self.account or self.company)


# (flag, env var, default) for the fixed interface; see the brief in docs/broker.md.
_ENV_FLAGS: tuple[tuple[str, str, str | None], ...] = (
    ("--host", environment.BROKER_HOST, "0.0.0.0"),
    ("--port", environment.BROKER_PORT, "8080"),
    ("--admin-port", BROKER_ADMIN_PORT, ""),
    ("--name", environment.BROKER_NAME, None),
    ("--cluster", environment.BROKER_CLUSTER, None),
    ("--account", environment.BROKER_ACCOUNT, ""),
    ("--company", environment.BROKER_COMPANY, ""),
    ("--data-dir", environment.BROKER_DATA_DIR, None),
    ("--message-log-dir", environment.BROKER_MESSAGE_LOG_DIR, None),
    ("--backend-url", environment.BROKER_BACKEND_URL, ""),
    ("--cloud-url", environment.BROKER_CLOUD_URL, ""),
    ("--backend-credentials-dir", environment.BROKER_BACKEND_CREDENTIALS_DIR, None),
    ("--cloud-credentials-dir", environment.BROKER_CLOUD_CREDENTIALS_DIR, None),
    ("--token-verifier-file", environment.BROKER_TOKEN_VERIFIER_FILE, None),
    ("--backend-token-verifier-file", environment.BROKER_BACKEND_TOKEN_VERIFIER_FILE, None),
    ("--token-grace-seconds", environment.BROKER_TOKEN_GRACE_SECONDS, "30"),
    ("--lease-seconds", BROKER_LEASE_SECONDS, "5"),
    ("--max-lease-seconds", BROKER_MAX_LEASE_SECONDS, None),  # None: --lease-seconds
    ("--max-deliveries", environment.BROKER_MAX_DELIVERIES, "5"),
    ("--on-poison", environment.BROKER_ON_POISON, PoisonPolicy.BLOCK_STREAM.value),
    ("--tls-dir", environment.BROKER_TLS_DIR, ""),
    ("--tls-reload-seconds", environment.BROKER_TLS_RELOAD_SECONDS, "10"),
    ("--client-ca-file", environment.BROKER_CLIENT_CA_FILE, ""),
    # One RFC 4514 subject per line in the variable; the flag may be given once per subject.
    ("--allowed-client-subjects", environment.BROKER_ALLOWED_CLIENT_SUBJECTS, ""),
    ("--upstream-ca-file", environment.BROKER_UPSTREAM_CA_FILE, ""),
    ("--log-format", environment.BROKER_FAILOVER_LOG_FORMAT, "text"),
    ("--log-level", environment.BROKER_FAILOVER_LOG_LEVEL, "INFO"),
)
_LIST_FLAGS = frozenset({"--allowed-client-subjects"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="broker-service",
        description="The stateful message broker; switched Active/Inactive only by the operator's Heartbeat.",
    )
    for flag, env, default in _ENV_FLAGS:
        if flag in _LIST_FLAGS:
            parser.add_argument(
                flag, default=None, action="append", help=f"repeatable (env {env}, one per line)"
            )
        else:
            parser.add_argument(flag, default=None, help=f"(env {env}, default {default!r})")
    parser.add_argument("--body-limit-bytes", type=int, default=BrokerSettings.body_limit_bytes)
    parser.add_argument(
        "--operator-body-limit-bytes", type=int, default=BrokerSettings.operator_body_limit_bytes
    )
    parser.add_argument("--bundle-max-messages", type=int, default=BrokerSettings.bundle_max_messages)
    parser.add_argument("--header-timeout-seconds", type=float, default=BrokerSettings.header_timeout_seconds)
    parser.add_argument("--body-timeout-seconds", type=float, default=BrokerSettings.body_timeout_seconds)
    parser.add_argument("--max-connections", type=int, default=BrokerSettings.max_connections)
    parser.add_argument("--forward-bundle-max", type=int, default=BrokerSettings.forward_bundle_max)
    parser.add_argument("--forward-concurrency", type=int, default=BrokerSettings.forward_concurrency)
    parser.add_argument("--poll-max", type=int, default=BrokerSettings.poll_max)
    parser.add_argument("--poll-idle-seconds", type=float, default=BrokerSettings.poll_idle_seconds)
    parser.add_argument("--retry-base-seconds", type=float, default=BrokerSettings.retry_base_seconds)
    parser.add_argument("--retry-max-seconds", type=float, default=BrokerSettings.retry_max_seconds)
    parser.add_argument("--relay-timeout-seconds", type=float, default=BrokerSettings.relay_timeout_seconds)
    parser.add_argument("--relay-reply-limit-bytes", type=int, default=BrokerSettings.relay_reply_limit_bytes)
    parser.add_argument("--journal-rotate-bytes", type=int, default=BrokerSettings.journal_rotate_bytes)
    parser.add_argument("--segment-max-bytes", type=int, default=BrokerSettings.segment_max_bytes)
    parser.add_argument("--segment-max-seconds", type=float, default=BrokerSettings.segment_max_seconds)
    parser.add_argument("--drain-seconds", type=float, default=BrokerSettings.drain_seconds)
    parser.add_argument("--token-check-seconds", type=float, default=BrokerSettings.token_check_seconds)
    parser.add_argument(
        "--tls-handshake-timeout-seconds", type=float, default=DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
    )
    return parser


def _number(text: str, flag: str, env: str, kind: type[int] | type[float], minimum: float) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise SettingsError(f"{flag} / {env} = {text!r} is not a {kind.__name__}") from None
    if not math.isfinite(value):
        # A NaN lease would never run out (every comparison with it is false), nor would an infinite one.
        raise SettingsError(f"{flag} / {env} = {text!r} is not a finite number")
    if value < minimum:
        raise SettingsError(f"{flag} / {env} = {text!r} must be at least {minimum}")
    return value


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> BrokerSettings:
    """Settings from ``argv`` (flags) over ``environ`` (env vars) over the defaults."""
    environ = os.environ if environ is None else environ
    args = _parser().parse_args(argv)
    raw: dict[str, str | None] = {}
    for flag, env, default in _ENV_FLAGS:
        key = flag.removeprefix("--").replace("-", "_")
        flag_value = getattr(args, key)
        if isinstance(flag_value, list):  # a repeatable flag: its values, one per line
            flag_value = "\n".join(flag_value)
        raw[key] = flag_value if flag_value is not None else environ.get(env, default)

    name = raw["name"] or environ.get("HOSTNAME", "broker")
    if raw["data_dir"] is None:
        raise SettingsError("--data-dir / BROKER_DATA_DIR is required: the journal and the epoch live there")
    token_verifier = _read_verifier(raw["token_verifier_file"], environ, _OPERATOR_CREDENTIAL)
    backend_token_verifier = _read_verifier(raw["backend_token_verifier_file"], environ, _BACKEND_CREDENTIAL)
    if backend_token_verifier == token_verifier:
        raise SettingsError(
            "--backend-token-verifier-file / BROKER_BACKEND_TOKEN_VERIFIER holds the operator's verifier "
            "(--token-verifier-file / BROKER_TOKEN_VERIFIER); give the backend a token of its own, or "
            "whoever can send bundles could also switch the broker"
        )
    port = int(_number(str(raw["port"]), "--port", environment.BROKER_PORT, int, 0))
    if args.relay_reply_limit_bytes < 1024:
        raise SettingsError(
            f"--relay-reply-limit-bytes = {args.relay_reply_limit_bytes} must be at least 1024 (a target's "
            "smallest reply is a few hundred bytes)"
        )
    backend_url = str(raw["backend_url"]).rstrip("/")
    cloud_url = str(raw["cloud_url"]).rstrip("/")
    backend_credentials_dir = Path(raw["backend_credentials_dir"]) if raw["backend_credentials_dir"] else None
    cloud_credentials_dir = Path(raw["cloud_credentials_dir"]) if raw["cloud_credentials_dir"] else None
    _check_target("--backend-url", backend_url, "--backend-credentials-dir", backend_credentials_dir)
    _check_target("--cloud-url", cloud_url, "--cloud-credentials-dir", cloud_credentials_dir)
    admin_port = _admin_port(str(raw["admin_port"] or ""), port)
    lease_seconds = _number(str(raw["lease_seconds"]), "--lease-seconds", BROKER_LEASE_SECONDS, float, 0.1)
    max_lease_seconds = _max_lease(raw["max_lease_seconds"], lease_seconds)
    try:
        tls_reload_seconds = parse_reload_seconds(str(raw["tls_reload_seconds"] or "10"))
        tls = parse_listener_tls(
            tls_dir=str(raw["tls_dir"] or ""),
            reload_seconds=tls_reload_seconds,
            client_ca_file=str(raw["client_ca_file"] or ""),
            allowed_client_subjects=str(raw["allowed_client_subjects"] or ""),
            handshake_timeout_seconds=args.tls_handshake_timeout_seconds,
            admin_port=admin_port,
        )
        upstream_ca_file = parse_upstream_ca(str(raw["upstream_ca_file"] or ""))
    except TlsSettingsError as error:
        raise SettingsError(str(error)) from None
    try:
        on_poison = PoisonPolicy(str(raw["on_poison"]))
    except ValueError:
        choices = [p.value for p in PoisonPolicy]
        raise SettingsError(
            f"--on-poison / BROKER_ON_POISON = {raw['on_poison']!r}; use one of {choices}"
        ) from None
    try:
        log = parse_log_settings(raw["log_format"], raw["log_level"])
    except LogSettingsError as error:
        raise SettingsError(str(error)) from None
    return BrokerSettings(
        host=str(raw["host"]),
        port=port,
        admin_port=admin_port,
        name=name,
        cluster=raw["cluster"] or name,
        account=str(raw["account"]),
        company=str(raw["company"]),
        data_dir=Path(raw["data_dir"]),
        message_log_dir=Path(raw["message_log_dir"]) if raw["message_log_dir"] else None,
        backend_url=backend_url,
        cloud_url=cloud_url,
        backend_credentials_dir=backend_credentials_dir,
        cloud_credentials_dir=cloud_credentials_dir,
        token_verifier=token_verifier,
        backend_token_verifier=backend_token_verifier,
        token_verifier_file=Path(raw["token_verifier_file"]) if raw["token_verifier_file"] else None,
        backend_token_verifier_file=(
            Path(raw["backend_token_verifier_file"]) if raw["backend_token_verifier_file"] else None
        ),
        token_grace_seconds=_number(
            str(raw["token_grace_seconds"]),
            "--token-grace-seconds",
            environment.BROKER_TOKEN_GRACE_SECONDS,
            float,
            0,
        ),
        lease_seconds=lease_seconds,
        max_lease_seconds=max_lease_seconds,
        max_deliveries=int(
            _number(str(raw["max_deliveries"]), "--max-deliveries", environment.BROKER_MAX_DELIVERIES, int, 1)
        ),
        on_poison=on_poison,
        tls_reload_seconds=tls_reload_seconds,
        tls=tls,
        upstream_ca_file=upstream_ca_file,
        log=log,
        body_limit_bytes=args.body_limit_bytes,
        operator_body_limit_bytes=args.operator_body_limit_bytes,
        bundle_max_messages=args.bundle_max_messages,
        header_timeout_seconds=args.header_timeout_seconds,
        body_timeout_seconds=args.body_timeout_seconds,
        max_connections=args.max_connections,
        forward_bundle_max=args.forward_bundle_max,
        forward_concurrency=args.forward_concurrency,
        poll_max=args.poll_max,
        poll_idle_seconds=args.poll_idle_seconds,
        retry_base_seconds=args.retry_base_seconds,
        retry_max_seconds=args.retry_max_seconds,
        relay_timeout_seconds=args.relay_timeout_seconds,
        relay_reply_limit_bytes=args.relay_reply_limit_bytes,
        journal_rotate_bytes=args.journal_rotate_bytes,
        segment_max_bytes=args.segment_max_bytes,
        segment_max_seconds=args.segment_max_seconds,
        drain_seconds=args.drain_seconds,
        token_check_seconds=args.token_check_seconds,
    )


def _check_target(url_flag: str, url: str, dir_flag: str, directory: Path | None) -> None:
    """A target's URL and credentials directory can be used together (read once, here, so that a
    wrong one stops the broker at start with the flag named, not at its first activation)."""
    try:
        relay_target("check", url, directory, flag=url_flag, dir_flag=dir_flag)
    except (TargetCredentialError, ValueError) as error:
        text = str(error) if isinstance(error, TargetCredentialError) else f"{url_flag} is not a URL: {error}"
        raise SettingsError(redact(text)) from None


def _max_lease(text: str | None, lease_seconds: float) -> float | None:
    """``--max-lease-seconds``: unset or empty is None (the lease); else at least the lease, since a
    handover renewal may only lengthen it (and the operator's successor waits out this much)."""
    if text is None or not text.strip():
        return None
    value = _number(text.strip(), "--max-lease-seconds", BROKER_MAX_LEASE_SECONDS, float, 0.1)
    if value < lease_seconds:
        raise SettingsError(
            f"--max-lease-seconds / {BROKER_MAX_LEASE_SECONDS} = {text.strip()} is below --lease-seconds / "
            f"{BROKER_LEASE_SECONDS} ({lease_seconds:g}); a handover renewal may only lengthen the lease: "
            "set it at least that, or leave it unset"
        )
    return value


def _admin_port(text: str, port: int) -> int | None:
    """``--admin-port``: unset or empty is None (one port for everything); else a port other than
    ``--port``, so that the two surfaces can never end up on one listener by accident."""
    if not text.strip():
        return None
    admin_port = int(_number(text.strip(), "--admin-port", BROKER_ADMIN_PORT, int, 1))
    if admin_port > 65535:
        raise SettingsError(f"--admin-port / {BROKER_ADMIN_PORT} = {text!r} must be at most 65535")
    if admin_port == port:
        raise SettingsError(
            f"--admin-port / {BROKER_ADMIN_PORT} = {admin_port} is the same as --port / BROKER_PORT; give "
            "the operator's calls a port of their own, or leave the admin port unset to serve "
            "everything on one"
        )
    return admin_port


@dataclass(frozen=True)
class _Credential:
    file_flag: str
    file_env: str
    value_env: str
    token_env: str  # where the token itself would be: refused in the broker's environment
    used_for: str


_OPERATOR_CREDENTIAL = _Credential(
    "--token-verifier-file",
    environment.BROKER_TOKEN_VERIFIER_FILE,
    environment.BROKER_TOKEN_VERIFIER,
    environment.BROKER_TOKEN,
    "Heartbeat and the admin operations refuse",
)
_BACKEND_CREDENTIAL = _Credential(
    "--backend-token-verifier-file",
    environment.BROKER_BACKEND_TOKEN_VERIFIER_FILE,
    environment.BROKER_BACKEND_TOKEN_VERIFIER,
    environment.BROKER_BACKEND_TOKEN,
    "SendMessages refuses",
)


def _read_verifier(path: str | None, environ: Mapping[str, str], credential: _Credential) -> str:
    """A token's verifier: the mounted Secret file wins over the value in the environment.

    The broker holds verifiers only, so a token in its environment is refused rather than
    ignored: it would sit in ``/proc/<pid>/environ`` for anyone who reads the process. There is
    no minimum token length here: a digest says nothing of the token's length or entropy, so that
    check is made where the token is (the operator refuses a short one from a user's Secret).
    """
    if environ.get(credential.token_env, "").strip():
        raise SettingsError(
            f"{credential.token_env} is set in the broker's environment: a broker holds only the token's "
            f"verifier, never the token; unset it and give {credential.value_env} or {credential.file_flag} "
            "(python -m broker_contracts.token_verifier prints one from a token on stdin)"
        )
    names = f"{credential.file_flag} / {credential.file_env}"
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise SettingsError(f"{names} = {path!r} cannot be read: {error}") from None
        if not text.strip():
            raise SettingsError(f"{names} = {path!r} is empty")
        return _verifier(text, f"{names} = {path!r}")
    value = environ.get(credential.value_env, "")
    if not value.strip():
        raise SettingsError(
            f"no credential: set {names} (the mounted verifier Secret) or {credential.value_env}; "
            f"{credential.used_for} every call without it"
        )
    return _verifier(value, credential.value_env)


def _verifier(text: str, source: str) -> str:
    try:
        parse_verifier(text)
    except VerifierError as error:  # the message never holds the text: it may be a token
        raise SettingsError(f"{source}: {error}") from None
    return text.strip()
