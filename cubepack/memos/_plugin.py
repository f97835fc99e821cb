"""MemOS plugin (entry point group ``memos.plugins``): runs :func:`cubepack.memos.install` when
a MemOS API server or scheduler discovers its plugins, so server deployments load cubes only
through cubepack's verified path. Imported by MemOS's plugin manager only."""

from __future__ import annotations

from memos.plugins.base import MemOSPlugin

from .._version import __version__
from ._hook import install


class CubepackPlugin(MemOSPlugin):
    name = "cubepack"
    version = __version__
    description = "Verified, pinned MemCube loading (cubepack.memos.install)."

    def on_load(self) -> None:
        install()  # the environment, or the defaults; never loosens settings already made
