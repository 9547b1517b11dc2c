"""Backend registry: the service picks one by name; each is imported lazily."""

from __future__ import annotations

from .base import Backend


def make_backend(name: str, pool_size: int = 4, image: str = "sgrpo-sandbox:latest",
                 mode: str = "resident") -> Backend:
    """Build a backend by name ('local' or 'docker'); docker-py is only needed for 'docker'.

    `mode`: 'resident' (warm sandboxes whose pid-1 runner spawns every run) or 'cold' (a fresh
    sandbox per run)."""
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(pool_size=pool_size, mode=mode)
    if name == "docker":
        from .docker_pool import DockerBackend

        return DockerBackend(image=image, pool_size=pool_size, mode=mode)
    raise ValueError(f"unknown backend {name!r}; choose 'local' or 'docker'")
