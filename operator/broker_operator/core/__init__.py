"""The failover engine's decision core: heartbeat and failover rules as pure functions.

``step`` takes what is known about a cluster's brokers, the spec, pod facts and the
time, and returns new knowledge plus a list of actions (heartbeat a broker with
``active`` and an epoch, allocate an epoch, point the ``-active`` Service, record an event).
Keeping the rules free of I/O lets hypothesis drive them against simulated brokers
with crashes, partitions, slow replies and clock steps (``tests/unit/core``).

No asyncio, zeep, aiohttp or kopf may be imported anywhere in this package; the
loop that carries out the actions lives in ``broker_operator.engine``.
"""

from broker_operator.core.actions import (
    Action,
    ActivePointed,
    AllocateEpoch,
    ConnectionLost,
    EpochGranted,
    EpochRefused,
    HeartbeatAnswered,
    HeartbeatFailed,
    Observation,
    PointActive,
    ProcessGone,
    RecordEvent,
    SendHeartbeat,
)
from broker_operator.core.decisions import (
    Decision,
    choose_next_active,
    epoch_usable,
    next_epoch,
    retry_delay,
    step,
)
from broker_operator.core.knowledge import ClusterConfig, EngineState, MoveKind, initial_state
from broker_operator.core.model import (
    BrokerTarget,
    FailbackMode,
    HeartbeatReply,
    HeartbeatSettings,
    PodFacts,
    SettingsError,
)
from broker_operator.core.planned_moves import failback_target
from broker_operator.core.reported import phase_of, status_of
from broker_operator.core.status import BrokerStatus, ClusterStatus, LastFailover, Phase

__all__ = [
    "Action",
    "ActivePointed",
    "AllocateEpoch",
    "BrokerStatus",
    "BrokerTarget",
    "ClusterConfig",
    "ClusterStatus",
    "ConnectionLost",
    "Decision",
    "EngineState",
    "EpochGranted",
    "EpochRefused",
    "FailbackMode",
    "HeartbeatAnswered",
    "HeartbeatFailed",
    "HeartbeatReply",
    "HeartbeatSettings",
    "LastFailover",
    "MoveKind",
    "Observation",
    "Phase",
    "PodFacts",
    "PointActive",
    "ProcessGone",
    "RecordEvent",
    "SendHeartbeat",
    "SettingsError",
    "choose_next_active",
    "epoch_usable",
    "failback_target",
    "initial_state",
    "next_epoch",
    "phase_of",
    "retry_delay",
    "status_of",
    "step",
]
