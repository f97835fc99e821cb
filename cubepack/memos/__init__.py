"""The MemOS hook: cubepack's guarantees where MemOS users load and use cubes.

- :func:`init_from_remote_repo` / :func:`init_from_dir` (``_load``): a cube pulled at an exact
  commit and verified, loaded as a MemOS ``GeneralMemCube``, each activation checked against
  the model MemOS loaded (``_activations``), text-memory vectors against its embedder
  (``_embedder``), its LoRA adapters against the base its parametric memory names
  (``_parametric``);
- :func:`install` / :func:`uninstall` (``_hook``): the same path under MemOS's own calls; the
  hook's settings are one :class:`~cubepack.trust.TrustPolicy` (:func:`settings`);
- :func:`pack_cube` (``_pack_cube``): a live cube written straight to a packed cube;
- :func:`register` (``_use``): tell the hook which model produced a cache built outside it;
- ``_plugin``: the ``memos.plugins`` entry point (imported by MemOS only).

MemOS is imported only inside these functions (it has import-time side effects).
"""

from ..trust._policy import POLICIES
from ._activations import HookReport
from ._hook import install, installed, settings, uninstall
from ._load import init_from_dir, init_from_remote_repo
from ._pack_cube import pack_cube
from ._use import register_cache as register

__all__ = ["POLICIES", "HookReport", "init_from_dir", "init_from_remote_repo", "register",
           "install", "installed", "pack_cube", "settings", "uninstall"]
