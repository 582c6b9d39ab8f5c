"""The image-to-command table (``images.yaml``) the node agent uses instead of a container runtime.

A container image here is only a name for an entry point: the table maps the image
name (registry ``docker.io/library/``, tag and digest stripped) to the argv prefix
its ENTRYPOINT would be. What it does not do: pull, verify or isolate anything; two
tags of one image run the same local code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_IMAGES_FILE = Path(__file__).with_name("images.yaml")


class ImageNotMappedError(LookupError):
    """The pod names an image the table does not know, or gives no command for an empty entry."""


def image_key(image: str) -> str:
    """``docker.io/library/busybox:1.36@sha256:..`` -> ``busybox``; keeps other registries' paths."""
    name = image.split("@", 1)[0]
    last_slash = name.rfind("/")
    if name.rfind(":") > last_slash:
        name = name[: name.rfind(":")]
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name


@dataclass(frozen=True)
class ImageTable:
    entrypoints: dict[str, list[str]]
    source: Path

    @classmethod
    def load(cls, path: Path = DEFAULT_IMAGES_FILE) -> ImageTable:
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(
                f"{path}: expected a mapping of image name to argv list, got {type(raw).__name__}"
            )
        entrypoints: dict[str, list[str]] = {}
        for image, argv in raw.items():
            if not isinstance(argv, list) or not all(isinstance(part, str) for part in argv):
                raise ValueError(f"{path}: image {image!r} must map to a list of strings, got {argv!r}")
            entrypoints[str(image)] = list(argv)
        return cls(entrypoints=entrypoints, source=path)

    def argv(self, image: str, command: list[str] | None, args: list[str] | None) -> list[str]:
        """The argv Kubernetes semantics give: ``command`` replaces the entrypoint, ``args`` append."""
        key = image_key(image)
        if key not in self.entrypoints:
            raise ImageNotMappedError(
                f"image {image!r} (key {key!r}) is not in {self.source}; "
                "add it with the local command it stands for"
            )
        entrypoint = list(command) if command else self.entrypoints[key]
        argv = entrypoint + list(args or [])
        if not argv:
            raise ImageNotMappedError(
                f"image {image!r} has no entrypoint in {self.source}; the container must set `command`"
            )
        return argv
