"""Fixtures of the image tests: the images ``make images`` built, and one containerd to run them.

``built_images`` builds what is out of date (``make test`` has already run ``make images``, so it is
a check of the keys) and fails, never skips, when a build fails. ``containerd`` is Debian's
containerd and runc in a sealed namespace of the session's own (``SealedContainerd``); an image is
imported into it the first time a test asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from local_cluster.containerd_sandbox import SealedContainerd
from local_cluster.image_archives import image_config
from local_cluster.image_build import IMAGES, BuiltImage, build_images
from local_cluster.processes import reap_on_exit


class ImageRunner:
    """The sandbox plus the built images: ``prepare(slug)`` imports one and returns its reference."""

    def __init__(self, sandbox: SealedContainerd, built: dict[str, BuiltImage]) -> None:
        self.sandbox = sandbox
        self.built = built
        self.imported: set[str] = set()

    def prepare(self, slug: str) -> str:
        image = self.built[slug]
        if slug not in self.imported:
            self.sandbox.import_image(image.archive)
            self.imported.add(slug)
        return image.reference

    def entrypoint(self, slug: str) -> list[str]:
        return [str(part) for part in image_config(self.built[slug].archive).get("Entrypoint") or []]  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def built_images() -> dict[str, BuiltImage]:
    built = build_images()
    return {spec.slug: image for spec, image in zip(IMAGES, built, strict=True)}


@pytest.fixture(scope="session")
def images(
    tmp_path_factory: pytest.TempPathFactory, built_images: dict[str, BuiltImage]
) -> Iterator[ImageRunner]:
    reap_on_exit()
    sandbox = SealedContainerd(Path(tmp_path_factory.mktemp("containerd")))
    sandbox.start()
    try:
        yield ImageRunner(sandbox, built_images)
    finally:
        left = sandbox.stop()
        assert not left, f"cgroups left behind on the machine: {left}"
