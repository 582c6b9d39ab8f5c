"""The soak's turn of faults: node faults only where the cluster has nodes to spare for them."""

from __future__ import annotations

import pytest

from local_cluster.soak import FAULTS, NODE_FAULTS, THREE_NODE_FAULTS, check_kinds, default_kinds, main


def test_one_node_takes_the_pod_faults_and_three_add_the_node_faults_before_the_api_server_kill() -> None:
    assert default_kinds(1) == FAULTS
    assert not set(NODE_FAULTS) & set(FAULTS)
    three = default_kinds(3)
    assert set(three) == set(FAULTS) | set(NODE_FAULTS)
    # Last: the kill of the active that follows it in turn needs an operator whose watches came back.
    assert three[-1] == "restart-apiserver" and three[0] == "kill-active"
    assert three == THREE_NODE_FAULTS


@pytest.mark.parametrize("nodes", [1, 2])
def test_node_faults_are_refused_without_three_nodes(nodes: int) -> None:
    with pytest.raises(ValueError, match="crash-node need three nodes"):
        check_kinds(["kill-active", "crash-node"], nodes)
    check_kinds(["kill-active"], nodes)  # pod faults are fine anywhere


@pytest.mark.parametrize("kinds", [[], ["kill-everything"]])
def test_an_empty_or_unknown_turn_is_refused(kinds: list[str]) -> None:
    with pytest.raises(ValueError, match="unknown faults"):
        check_kinds(kinds, 3)


def test_the_command_line_refuses_node_faults_on_one_node_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--nodes", "1", "--faults-only", "partition-node"])
    assert exited.value.code == 2
    assert "need three nodes" in capsys.readouterr().err
