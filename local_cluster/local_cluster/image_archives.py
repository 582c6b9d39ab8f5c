"""The OCI archives ``make images`` writes: where an image's is, and what its config says.

Read by what runs the images (the sealed cluster's node imports the archives into containerd; the
image tests read an image's ``Entrypoint``), never by the build itself.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from local_cluster.image_build import CACHE_DIR, IMAGES, TAG, ImageBuildError


def archive_for(reference: str, cache: Path = CACHE_DIR) -> Path:
    """The OCI archive of an image ``make images`` built; a clear error when it never was."""
    for spec in IMAGES:
        if reference in (spec.reference, f"{spec.name}:{TAG}", spec.name):
            archive = cache / "archives" / f"{spec.slug}.oci.tar"
            if archive.exists():
                return archive
            raise ImageBuildError(
                f"image {reference} has not been built: run `make images` ({archive} is missing)"
            )
    raise ImageBuildError(
        f"image {reference} is not one that `make images` builds ({', '.join(s.reference for s in IMAGES)})"
    )


def image_config(archive: Path) -> dict[str, object]:
    """The image's config (``Entrypoint``, ``Cmd``, ``User``, ...) from its OCI archive."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict[str, Any]:
            member = tar.extractfile("blobs/" + digest.replace(":", "/"))
            assert member is not None
            loaded: dict[str, Any] = json.load(member)
            return loaded

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        manifest = blob(json.load(index_file)["manifests"][0]["digest"])
        config: dict[str, object] = blob(manifest["config"]["digest"]).get("config", {})
        return config
