"""``skaffold.yaml``, run by skaffold: ``skaffold build`` through its custom builder to a registry,
then ``skaffold render`` of what it built.

skaffold is built from its Go module (``make skaffold``, hack/skaffold); the registry is Debian's
``docker-registry`` (the CNCF distribution registry). Both run in a network namespace of this
module's own (``unshare --net``) that has only loopback, so nothing skaffold does can leave the
machine: not its update check, its metrics, or a pull. The custom builder
(hack/images/skaffold-build.sh) is the same daemonless build as ``make images``, then a
``buildah push`` to skaffold's ``$IMAGE``; the registry speaks plain HTTP, which skaffold is told
with ``--insecure-registry`` and buildah with a registries.conf of the test's own, as a user would
configure a registry of theirs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import REPO_ROOT, built_tools_dir
from local_cluster.image_build import BuiltImage
from local_cluster.netns import call_in_network_namespace
from local_cluster.processes import ManagedProcess, reap_on_exit
from tests.e2e.support import wait_for

# Inside the module's own network namespace nothing else listens, so a fixed port is free.
pytestmark = pytest.mark.needs("skaffold")  # built last, behind the e2e tests (Makefile)

REGISTRY = "127.0.0.1:5000"
TAG = "skaffold-test"
# skaffold.yaml's artifacts and the `make images` image each one is.
ARTIFACTS = {
    "localhost/broker-failover/operator": "operator",
    "localhost/broker-failover/broker": "broker",
    "localhost/broker-failover/validator": "validator",
}
MANIFEST_TYPES = ", ".join(
    ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
)


@dataclasses.dataclass
class Skaffold:
    """skaffold and a registry in one loopback-only network namespace (the registry's)."""

    registry: ManagedProcess
    binary: Path
    workdir: Path
    environment: dict[str, str]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.inside([str(self.binary), *args, "--update-check=false", "--interactive=false"]),
            cwd=REPO_ROOT,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def build(self, registry: str, output: Path, *more: str) -> subprocess.CompletedProcess[str]:
        """``skaffold build`` pushing to ``registry`` (plain HTTP), its record in ``output``."""
        return self.run(
            "build",
            f"--default-repo={registry}",
            f"--insecure-registry={registry}",
            f"--tag={TAG}",
            f"--file-output={output}",
            "--cache-artifacts=false",
            *more,
        )

    def inside(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", f"--target={self.registry.pid}", "--net", "--", *argv]

    def manifest_digest(self, repository: str, tag: str) -> str | None:
        """The digest the registry serves for ``repository:tag`` (its Docker-Content-Digest)."""

        def head() -> str | None:
            request = urllib.request.Request(
                f"http://{REGISTRY}/v2/{repository}/manifests/{tag}",
                method="HEAD",
                headers={"Accept": MANIFEST_TYPES},
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return str(response.headers["Docker-Content-Digest"])
            except (urllib.error.URLError, ConnectionError):
                return None

        return call_in_network_namespace(f"/proc/{self.registry.pid}/ns/net", head)


def skaffold_binary() -> Path:
    """The skaffold ``make skaffold`` built for the current pin; fails (never skips) if it is not there."""
    path = Path(
        subprocess.run(
            [str(REPO_ROOT / "hack/skaffold/build.sh"), "--print"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    )
    assert path.is_file(), f"skaffold is not built at {path}: run `make skaffold` (minutes, once)"
    return path


@pytest.fixture(scope="module")
def skaffold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Skaffold]:
    reap_on_exit()
    workdir = tmp_path_factory.mktemp("skaffold")
    config = workdir / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(workdir / "registry")}},
                "http": {"addr": REGISTRY},
            }
        )
    )
    registries = workdir / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{REGISTRY}"\ninsecure = true\n')
    registry = ManagedProcess(
        "registry",
        ["unshare", "--net", "--", "sh", "-c", f"ip link set lo up && exec docker-registry serve {config}"],
        log_path=workdir / "registry.log",
    )
    environment = {
        **os.environ,
        # helm for the chart's deploy section (skaffold render runs `helm template`).
        "PATH": f"{built_tools_dir()}:{os.environ['PATH']}",
        # No cluster: skaffold build and render --offline need none, and must not find the
        # user's.
        "KUBECONFIG": str(workdir / "no-kubeconfig"),
        # skaffold's own settings (global config, survey state) stay in the test's folder; the
        # image build's cache stays where `make images` left it.
        "HOME": str(workdir / "home"),
        "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
    }
    tool = Skaffold(registry, skaffold_binary(), workdir, environment)
    try:
        wait_for(
            "the registry's /v2/ in its namespace",
            lambda: registry.exited() or _answers(tool),
            30,
        )
        assert not registry.exited(), f"docker-registry exited:\n{registry.log_tail()}"
        yield tool
    finally:
        registry.stop()


def _answers(tool: Skaffold) -> bool:
    def get() -> bool:
        try:
            with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    return call_in_network_namespace(f"/proc/{tool.registry.pid}/ns/net", get)


@pytest.fixture(scope="module")
def build_output(skaffold: Skaffold) -> dict[str, str]:
    """``skaffold build`` of every artifact: image name -> the reference skaffold recorded."""
    output = skaffold.workdir / "build.json"
    result = skaffold.build(REGISTRY, output)
    assert result.returncode == 0, f"skaffold build failed:\n{result.stdout}\n{result.stderr}"
    builds = json.loads(output.read_text())["builds"]
    return {build["imageName"]: build["tag"] for build in builds}


def test_skaffold_build_pushes_each_image_make_images_built(
    skaffold: Skaffold, build_output: dict[str, str], built_images: dict[str, BuiltImage]
) -> None:
    assert set(build_output) == set(ARTIFACTS), build_output
    for name, slug in ARTIFACTS.items():
        repository = name.replace("/", "_")  # skaffold's default-repo naming
        reference, _, digest = build_output[name].partition("@")
        assert reference == f"{REGISTRY}/{repository}:{TAG}", build_output[name]
        # The custom builder pushed the very image `make images` built (same manifest), and the
        # registry serves it under skaffold's tag.
        assert digest == built_images[slug].digest, (name, digest, built_images[slug].digest)
        assert skaffold.manifest_digest(repository, TAG) == digest, name


def test_skaffold_render_points_the_chart_and_the_examples_at_the_built_images(
    skaffold: Skaffold, build_output: dict[str, str]
) -> None:
    rendered = skaffold.workdir / "rendered.yaml"
    result = skaffold.run(
        "render",
        f"--build-artifacts={skaffold.workdir / 'build.json'}",
        "--offline=true",
        "--digest-source=none",
        f"--output={rendered}",
    )
    assert result.returncode == 0, f"skaffold render failed:\n{result.stdout}\n{result.stderr}"
    documents = [doc for doc in yaml.safe_load_all(rendered.read_text()) if doc]
    operators = [doc for doc in documents if doc["kind"] == "Deployment"]
    assert len(operators) == 1, [doc["kind"] for doc in documents]
    images = {c["image"] for c in operators[0]["spec"]["template"]["spec"]["containers"]}
    assert images == {build_output["localhost/broker-failover/operator"]}
    clusters = {doc["metadata"]["name"]: doc for doc in documents if doc["kind"] == "BrokerCluster"}
    assert set(clusters) == {"orders", "payments"}, sorted(clusters)
    for cluster in clusters.values():
        assert cluster["spec"]["image"] == build_output["localhost/broker-failover/broker"], cluster[
            "metadata"
        ]["name"]


def test_a_push_the_registry_refuses_fails_skaffold_build(skaffold: Skaffold) -> None:
    # Nothing listens on this port in the namespace: the custom builder's push is refused, and
    # skaffold must fail naming the artifact rather than record an image that is nowhere.
    nowhere = "127.0.0.1:5999"
    output = skaffold.workdir / "refused.json"
    result = skaffold.build(nowhere, output, "--build-image=localhost/broker-failover/broker")
    text = result.stdout + result.stderr
    assert result.returncode != 0, text
    assert "localhost/broker-failover/broker" in text and "connection refused" in text, text
    builds: Any = json.loads(output.read_text())["builds"] if output.exists() else None
    assert not builds, builds
