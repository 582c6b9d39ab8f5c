"""``make images``: every image the chart and the local cluster run, built from the repository's
Dockerfiles without a daemon and without a registry (docs/images.md).

Steps, each skipped when its key is unchanged:

1. The base the Dockerfiles name, ``debian:bookworm-slim``, made from Debian's packages with
   ``mmdebstrap`` as Debian's own image is (minbase, merged /usr, no docs, man pages or
   locales, the same apt clean-up settings) and committed under that name in buildah's storage
   under the cache. Nothing is ever pulled.
2. Each image: ``buildah bud --pull=never`` of its Dockerfile from the repository root, keyed by a
   hash of the base, the Dockerfile, its target and every file its ``COPY`` lines name.
3. ``buildah push`` to an OCI archive under the cache (``archives/<name>.oci.tar``), which
   ``ctr images import``, ``kind load image-archive`` and ``skopeo copy oci-archive:...`` take.

It prints one line per image at the end: reference, digest, uncompressed size. Long steps stream
their progress (buildah's STEP lines) to stderr; a failing step ends the run with that step's
output and the full log's path, not a stack trace.

RUN steps reach the package registries through this machine's network, as ``docker build`` would:
apt over Debian's mirror and pip over PyPI. pip inside the build is given this machine's trust
store and pip index (a build-time mount, never part of an image) so that it works behind the same
TLS-inspecting proxy as the machine's own pip; on an ordinary machine that changes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from local_cluster import debian_base
from local_cluster.debian_base import PRIVATE_MOUNTS, mmdebstrap_command
from local_cluster.image_keys import content_key

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(
    os.environ.get("BROKER_FAILOVER_IMAGES_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "broker-failover" / "images"
)
TAG = "0.1.0"  # the chart's appVersion and the CRD's default broker image tag
# Our images are named under "localhost": a name without a registry means Docker Hub, under an owner
# nobody here controls, so a node missing the image would pull a stranger's. Under localhost nothing
# public resolves; a real cluster gets them from a registry its user names (charts/README.md, "Images").
REGISTRY = "localhost"
BASE_REFERENCE = "docker.io/library/debian:bookworm-slim"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_PACKAGES = {"buildah": "buildah", "mmdebstrap": "mmdebstrap"}


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """One image: its name (without registry or tag; ``reference`` adds them), Dockerfile and optional
    build target."""

    name: str
    dockerfile: str
    target: str | None = None
    # A binary ``make tools`` built (hack/tools): the build's context is a folder holding only it.
    tool: str | None = None

    @property
    def reference(self) -> str:
        return f"{REGISTRY}/{self.name}:{TAG}"

    @property
    def slug(self) -> str:
        return self.name.rsplit("/", 1)[-1]


IMAGES = (
    ImageSpec("broker-failover/broker", "broker_image/Dockerfile"),
    ImageSpec("broker-failover/operator", "operator/Dockerfile"),
    ImageSpec("broker-failover/validator", "validator/Dockerfile"),
    ImageSpec("broker-failover/backend-simulator", "simulators/Dockerfile", "backend-simulator"),
    ImageSpec("broker-failover/cloud-simulator", "simulators/Dockerfile", "cloud-simulator"),
    # The pod sandbox ("pause") image of the local cluster's node: containerd's sandbox_image.
    ImageSpec("broker-failover/pause", "local_cluster/pause-image/Dockerfile"),
    # The local cluster's DNS, a pod of its own (local_cluster/cluster_dns.yaml).
    ImageSpec("broker-failover/coredns", "local_cluster/coredns-image/Dockerfile", tool="coredns"),
    # A real Prometheus for the monitoring tests (issue 43): Debian's package, as users run it beside us.
    ImageSpec("broker-failover/prometheus", "local_cluster/prometheus-image/Dockerfile"),
    # The local cluster's volume provisioner and its helper pods (local_cluster/local_path_storage.yaml).
    ImageSpec(
        "broker-failover/local-path-provisioner",
        "local_cluster/local-path-image/Dockerfile",
        tool="local-path-provisioner",
    ),
)


class ImageBuildError(RuntimeError):
    """A step failed; the message says which, with its output (no traceback is owed)."""


@dataclasses.dataclass(frozen=True)
class BuiltImage:
    reference: str
    key: str
    digest: str
    size: int
    archive: Path


def say(text: str) -> None:
    print(f">> {text}", file=sys.stderr, flush=True)


def base_key() -> str:
    # The lock is part of the recipe: recording a new package set rebuilds the base to match it.
    lock = debian_base.lock_path(debian_base.architecture())
    recipe = json.dumps(
        [
            BASE_REFERENCE,
            debian_base.MMDEBSTRAP_OPTIONS,
            debian_base.DEBIAN_MIRRORS,
            PATH_ENV,
            _version("mmdebstrap"),
            lock.read_text() if lock.exists() else "",
        ]
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:20]


def _version(program: str) -> str:
    result = subprocess.run([program, "--version"], capture_output=True, text=True, check=False, timeout=30)
    return result.stdout.strip()


# --- buildah -----------------------------------------------------------------------------------


class Builder:
    """buildah with its storage under the cache, and the build's state file."""

    def __init__(self, cache: Path = CACHE_DIR, root: Path = REPO_ROOT) -> None:
        self.cache = cache
        self.root = root
        self.archives = cache / "archives"
        self.logs = cache / "logs"
        self.state_file = cache / "images.json"
        self.started = time.monotonic()

    @property
    def storage_options(self) -> list[str]:
        return [
            "--root",
            str(self.cache / "storage"),
            "--runroot",
            str(self.cache / "run"),
            "--storage-driver",
            "overlay",
        ]

    def buildah(self, *args: str, timeout: float = 600) -> str:
        command = [*PRIVATE_MOUNTS, "buildah", *self.storage_options, *args]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout)
        if result.returncode != 0:
            raise ImageBuildError(f"{' '.join(command)} failed:\n{result.stderr.strip()}")
        return result.stdout.strip()

    def has_image(self, reference: str) -> bool:
        try:
            self.buildah("inspect", "--type", "image", reference, timeout=60)
        except ImageBuildError:
            return False
        return True

    def state(self) -> dict[str, dict[str, object]]:
        try:
            loaded = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def record(self, name: str, entry: dict[str, object]) -> None:
        state = self.state()
        state[name] = entry
        scratch = self.state_file.with_suffix(".tmp")
        scratch.write_text(json.dumps(state, indent=2, sort_keys=True))
        scratch.replace(self.state_file)

    def elapsed(self) -> str:
        return f"[{time.monotonic() - self.started:.0f}s]"

    # --- base ---

    def ensure_base(self) -> str:
        key = base_key()
        if self.state().get(BASE_REFERENCE, {}).get("key") == key and self.has_image(BASE_REFERENCE):
            return key
        say(f"{self.elapsed()} making {BASE_REFERENCE} from Debian's packages with mmdebstrap (a minute)")
        scratch = self.cache / "base-rootfs.tar"
        self._run_logged(mmdebstrap_command(scratch), self.logs / "base.log", "the base image (mmdebstrap)")
        try:  # the packages must be the ones the lock records (debian_base.py says why)
            arch = debian_base.architecture()
            debian_base.check(debian_base.installed_packages(scratch), debian_base.lock_path(arch))
        except debian_base.BaseLockError as error:
            scratch.unlink(missing_ok=True)
            raise ImageBuildError(str(error)) from None
        container = self.buildah("from", "scratch")
        try:
            self.buildah("add", container, str(scratch), "/")
            self.buildah("config", "--env", PATH_ENV, "--cmd", "bash", container)
            self.buildah("commit", "--rm", "-q", container, BASE_REFERENCE)
        except ImageBuildError:
            with contextlib.suppress(ImageBuildError):  # the commit's error is the one to report
                self.buildah("rm", container)
            raise
        finally:
            scratch.unlink(missing_ok=True)
        self.record(BASE_REFERENCE, {"key": key})
        say(f"{self.elapsed()} {BASE_REFERENCE} committed")
        return key

    # --- images ---

    def context(self, spec: ImageSpec) -> Path:
        """The build context: the repository, or for a tool's image a folder with that binary alone."""
        if spec.tool is None:
            return self.root
        printed = subprocess.run(
            [str(self.root / "hack/tools/build.sh"), "--print"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        binary = Path(printed.stdout.strip()) / spec.tool
        if not binary.is_file():
            raise ImageBuildError(f"{spec.reference} packs {binary}, which is not built: run `make tools`")
        context = self.cache / "contexts" / spec.slug
        context.mkdir(parents=True, exist_ok=True)
        staged = context / spec.tool
        if not staged.exists() or staged.read_bytes() != binary.read_bytes():
            shutil.copy2(binary, staged)
        return context

    def build(self, spec: ImageSpec, base: str) -> BuiltImage:
        context = self.context(spec)
        try:
            key = content_key(self.root / spec.dockerfile, (base, spec.reference, spec.target or ""), context)
        except FileNotFoundError as error:
            raise ImageBuildError(f"{spec.dockerfile}: {error}") from None
        archive = self.archives / f"{spec.slug}.oci.tar"
        known = self.state().get(spec.name, {})
        if known.get("key") == key and archive.exists():
            return BuiltImage(spec.reference, key, str(known["digest"]), int(str(known["size"])), archive)
        say(f"{self.elapsed()} building {spec.reference} from {spec.dockerfile}")
        with self._pip_settings() as mounts:
            command = [
                *PRIVATE_MOUNTS,
                "buildah",
                *self.storage_options,
                "bud",
                "--pull=never",
                "--isolation",
                "chroot",
                "--layers",
                *mounts,
                "-f",
                str(self.root / spec.dockerfile),
                *(["--target", spec.target] if spec.target else []),
                "-t",
                spec.reference,
                str(context),
            ]
            self._run_logged(command, self.logs / f"{spec.slug}.log", spec.reference, progress=True)
        self.archives.mkdir(parents=True, exist_ok=True)
        scratch = archive.with_suffix(".partial")
        scratch.unlink(missing_ok=True)
        digest_file = self.cache / f"{spec.slug}.digest"
        self.buildah(
            "push", "--quiet", "--digestfile", str(digest_file), spec.reference,
            f"oci-archive:{scratch}:{spec.reference}",
        )  # fmt: skip
        scratch.replace(archive)
        digest = digest_file.read_text().strip()
        size = self.image_size(spec.reference)
        self.record(spec.name, {"key": key, "digest": digest, "size": size, "archive": str(archive)})
        say(f"{self.elapsed()} {spec.reference} done")
        return BuiltImage(spec.reference, key, digest, size, archive)

    def image_size(self, reference: str) -> int:
        """Uncompressed size: what the image takes once unpacked on a node (buildah says it in
        decimal units with three significant digits, "165 MB")."""
        images = json.loads(self.buildah("images", "--json", reference))
        return parse_size(str(images[0]["size"]))

    @contextlib.contextmanager
    def _pip_settings(self) -> Iterator[list[str]]:
        """Build-time mounts that give pip in RUN steps this machine's trust store and index."""
        bundle = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
        if not bundle.is_file():
            yield []
            return
        config = self.cache / "pip.conf"
        lines = ["[global]", "cert = /etc/pip-build-ca.crt"]
        if os.environ.get("PIP_INDEX_URL"):
            lines.append(f"index-url = {os.environ['PIP_INDEX_URL']}")
        config.write_text("\n".join(lines) + "\n")
        yield ["-v", f"{config}:/etc/pip.conf:ro", "-v", f"{bundle}:/etc/pip-build-ca.crt:ro"]

    def _run_logged(self, command: list[str], log: Path, what: str, progress: bool = False) -> None:
        """Run ``command`` from the repository root, its output to ``log``; STEP lines to stderr."""
        log.parent.mkdir(parents=True, exist_ok=True)
        tail: list[str] = []
        with log.open("w") as sink:
            process = subprocess.Popen(
                command, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert process.stdout is not None
            for line in process.stdout:
                sink.write(line)
                tail = [*tail[-39:], line.rstrip()]
                if progress and ("STEP " in line or line.startswith("Successfully tagged")):
                    print(f"   {self.elapsed()} {line.rstrip()}", file=sys.stderr, flush=True)
            code = process.wait()
        if code != 0:
            step = next((line for line in reversed(tail) if "STEP " in line), "")
            raise ImageBuildError(
                f"building {what} failed (exit {code})"
                + (f" at {step.strip()}" if step else "")
                + ":\n"
                + "\n".join(f"  | {line}" for line in tail)
                + f"\nfull log: {log}"
            )


def check_host_programs() -> None:
    missing = [package for program, package in HOST_PACKAGES.items() if shutil.which(program) is None]
    if missing:
        raise ImageBuildError(
            f"make images needs {', '.join(missing)} (Debian packages): `make image-packages` installs them"
        )


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    """One build at a time per cache (two `make` runs would race on buildah's tags and archives)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_images(
    names: Sequence[str] = (),
    cache: Path = CACHE_DIR,
    root: Path = REPO_ROOT,
    specs: Sequence[ImageSpec] = IMAGES,
) -> list[BuiltImage]:
    """Build (or find up to date) the images named, or all; return them in ``specs`` order."""
    unknown = set(names) - {spec.name for spec in specs} - {spec.slug for spec in specs}
    if unknown:
        known = ", ".join(spec.slug for spec in specs)
        raise ImageBuildError(f"no such image: {', '.join(sorted(unknown))}; known: {known}")
    chosen = [spec for spec in specs if not names or spec.name in names or spec.slug in names]
    check_host_programs()
    with locked(cache):
        builder = Builder(cache, root)
        base = builder.ensure_base()
        return [builder.build(spec, base) for spec in chosen]


_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_size(text: str) -> int:
    number, _, unit = text.strip().partition(" ")
    if unit not in _UNITS:
        raise ImageBuildError(f"buildah reported an image size this cannot read: {text!r}")
    return round(float(number) * _UNITS[unit])


def human_size(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("images", nargs="*", help="names (broker, operator, ...) to build; default all")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help="buildah storage, archives, logs")
    parser.add_argument("--print-archives", action="store_true", help="print the archives' folder and exit")
    parser.add_argument(
        "--without-tools",
        action="store_true",
        help="only the images that pack no `make tools` binary (`make test` builds them while tools build)",
    )
    parser.add_argument(
        "--dockerfile",
        metavar="NAME=PATH",
        help="build only this Dockerfile as image NAME (with --context), instead of the project's images",
    )
    parser.add_argument("--context", type=Path, default=REPO_ROOT, help="the build context for --dockerfile")
    parser.add_argument(
        "--push",
        metavar="REFERENCE",
        help="with one image named: also push it to REFERENCE (docker://registry/name:tag); skaffold's"
        " custom builder (hack/images/skaffold-build.sh) passes its $IMAGE here",
    )
    parser.add_argument(
        "--lock-base",
        action="store_true",
        help="make the Debian base with mmdebstrap and record its packages in hack/images (and exit)",
    )
    options = parser.parse_args(argv)
    if options.lock_base:
        return debian_base.lock_base_main()
    if options.print_archives:
        print(options.cache / "archives")
        return 0
    specs: Sequence[ImageSpec] = IMAGES
    if options.dockerfile:
        name, _, path = options.dockerfile.partition("=")
        context = options.context.resolve()
        specs = (ImageSpec(name, str(Path(path).resolve().relative_to(context))),)
    if options.without_tools:
        specs = tuple(spec for spec in specs if spec.tool is None)
    try:
        built = build_images(options.images, options.cache, options.context.resolve(), specs)
    except ImageBuildError as error:
        print(f"make images: {error}", file=sys.stderr)
        return 1
    if options.push:
        if len(built) != 1:
            print("make images: --push takes exactly one image name", file=sys.stderr)
            return 2
        try:
            Builder(options.cache).buildah(
                "push", built[0].reference, f"docker://{options.push}", timeout=1800
            )
        except ImageBuildError as error:
            print(f"make images: {error}", file=sys.stderr)
            return 1
    width = max(len(image.reference) for image in built)
    for image in built:
        print(f"{image.reference:{width}}  {image.digest}  {human_size(image.size):>9}  {image.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
