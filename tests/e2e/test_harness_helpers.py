"""Fast tests of the node agent's pure helpers: image table, path rewriting, ``$(VAR)``, exits.

These need no cluster; they pin down the fake parts' rules (documented in
docs/local-cluster.md) so a change to them is a visible decision.
"""

from __future__ import annotations

import base64
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from local_cluster.atomic_writer import write_atomically
from local_cluster.container_env import ApiServerAddress, expand_references
from local_cluster.container_state import describe_exit
from local_cluster.images import ImageNotMappedError, ImageTable, image_key
from local_cluster.netns import PodAddressPool
from local_cluster.pod_sandbox import PodSandbox
from local_cluster.pod_volumes import Mount, rewrite_paths


@pytest.mark.parametrize(
    ("image", "key"),
    [
        ("busybox", "busybox"),
        ("busybox:1.36", "busybox"),
        ("docker.io/library/python:3.11@sha256:abc", "python"),
        ("localhost:5000/broker-failover/broker:dev", "localhost:5000/broker-failover/broker"),
        ("broker-failover/broker:0.1.0", "broker-failover/broker"),
    ],
)
def test_image_key_strips_tag_digest_and_docker_hub_prefix(image: str, key: str) -> None:
    assert image_key(image) == key


def test_image_table_follows_kubernetes_command_and_args_semantics(tmp_path: Path) -> None:
    table_file = tmp_path / "images.yaml"
    table_file.write_text("tool: [tool-bin, --fixed]\nbare: []\n")
    table = ImageTable.load(table_file)
    assert table.argv("tool:1", None, ["a"]) == ["tool-bin", "--fixed", "a"]
    assert table.argv("tool", ["other"], ["a"]) == ["other", "a"]  # command replaces the entrypoint
    with pytest.raises(ImageNotMappedError, match="must set `command`"):
        table.argv("bare", None, None)
    with pytest.raises(ImageNotMappedError, match=r"'unknown'.*images\.yaml"):
        table.argv("unknown", None, None)


def test_image_table_refuses_a_malformed_file(tmp_path: Path) -> None:
    table_file = tmp_path / "images.yaml"
    table_file.write_text("tool: not-a-list\n")
    with pytest.raises(ValueError, match="'tool' must map to a list of strings"):
        ImageTable.load(table_file)


def test_the_shipped_image_table_maps_every_project_image() -> None:
    table = ImageTable.load()
    assert table.argv("broker-failover/broker:dev", None, None) == ["broker-service"]
    assert table.argv("broker-failover/operator", None, None) == ["broker-operator"]


MOUNTS = [
    Mount("/data", Path("/local/claims/journal")),
    Mount("/data/sub", Path("/local/sub")),
    Mount("/tmp", Path("/local/tmp")),
]


@pytest.mark.parametrize(
    ("text", "rewritten"),
    [
        ("/data", "/local/claims/journal"),
        ("/data/journal.log", "/local/claims/journal/journal.log"),
        ("--journal=/data/j", "--journal=/local/claims/journal/j"),
        ("/data/sub/x", "/local/sub/x"),  # the longer mount wins
        ("/database", "/database"),  # a prefix of a name is not a mount
        ("relative/data", "relative/data"),
        ("a:/tmp:/data", "a:/local/tmp:/local/claims/journal"),
        ("/tmp/data", "/local/tmp/data"),  # rewritten once, never again by a shorter mount
    ],
)
def test_rewrite_paths(text: str, rewritten: str) -> None:
    assert rewrite_paths(text, MOUNTS) == rewritten


def test_expand_references_as_kubernetes_does() -> None:
    env = {"HOST": "127.0.0.5"}
    assert expand_references("--bind=$(HOST):80", env) == "--bind=127.0.0.5:80"
    assert expand_references("$(MISSING)", env) == "$(MISSING)"
    assert expand_references("$$(HOST)", env) == "$(HOST)"


def test_describe_exit_reports_signals_as_128_plus_signal() -> None:
    assert describe_exit(-signal.SIGKILL) == (137, "Error")
    assert describe_exit(0) == (0, "Completed")
    assert describe_exit(3) == (3, "Error")


def test_pod_address_pool_never_hands_out_an_address_twice() -> None:
    pool = PodAddressPool("127.9.9.0/24", node_address="127.9.9.1")
    first = pool.allocate("uid-a")
    assert first == "127.9.9.2"
    assert pool.allocate("uid-a") == first  # idempotent per pod
    second = pool.allocate("uid-b")
    assert second != first
    pool.release("uid-a")
    addresses = {pool.allocate(f"uid-{n}") for n in range(252)}  # all that is left
    assert first in addresses and second not in addresses
    with pytest.raises(RuntimeError, match=r"127\.9\.9\.0/24 exhausted"):
        pool.allocate("one-too-many")


def test_a_secret_volume_is_swapped_atomically_as_the_kubelet_does(tmp_path: Path) -> None:
    volume = tmp_path / "operator-token"
    assert write_atomically(volume, {"token": b"t1", "nested/key": b"n1"})
    token = volume / "token"
    assert (token.is_symlink(), token.read_bytes(), (volume / "nested" / "key").read_bytes()) == (
        True,
        b"t1",
        b"n1",
    )
    first = token.resolve()
    assert not write_atomically(volume, {"token": b"t1", "nested/key": b"n1"}), "unchanged: no swap"
    assert write_atomically(volume, {"token": b"t2"})
    # The same path now names a new file (what a broker's stat notices); the old one is gone.
    assert token.read_bytes() == b"t2" and token.resolve() != first and not first.exists()
    assert not (volume / "nested").exists()
    assert sorted(p.name for p in volume.iterdir() if not p.name.startswith("..")) == ["token"]


class SecretsStandIn:
    """The one CoreV1Api call a Secret volume needs, answering from a dict."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in self.data.items()}
        return SimpleNamespace(data=encoded)


def test_refresh_volumes_follows_a_changed_secret(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "containers": [],
            "volumes": [
                {"name": "tok", "secret": {"secretName": "s", "items": [{"key": "token", "path": "token"}]}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    secrets = SecretsStandIn({"token": "old"})
    sandbox = PodSandbox(
        pod,
        pod_dir=tmp_path / "pod",
        claims_dir=tmp_path / "claims",
        core=secrets,  # type: ignore[arg-type]
        apiserver=ApiServerAddress("127.0.0.1", 6443, tmp_path / "ca.crt"),
        pod_ip="127.0.0.2",
        host_ip="127.0.0.1",
    )
    sandbox.materialize_volumes()
    token = sandbox.volume_paths["tok"] / "token"
    assert token.read_text() == "old"
    assert sandbox.refresh_volumes() == []
    secrets.data = {"token": "new"}
    assert sandbox.refresh_volumes() == ["tok"]
    assert token.read_text() == "new"
