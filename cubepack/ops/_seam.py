"""What the parts above ``ops`` use of it beyond its public face (``cubepack.ops``): the one
declared seam into its private modules.

The Hub side, the runtimes and the MemOS hook orchestrate verbs too: they ask whether a lock is
a private cube's and open one in memory (whole, or one memory's chunks), decrypt a KV file,
require the pinned models were checked, load a verified cube's memories into MemOS's (every
kind's checks run there), verify a folder whose memories are fetched on first use. Those
helpers are reached here, each a decision: a part above that imports any other private module
of ``ops`` fails ``tests/test_architecture.py``, which lists this seam.
"""

from ._load import load_verified
from ._private import decrypted_file, is_private, open_private
from ._private_range import PrivateRanges
from ._verify import require_checked_models, verify_fetched_later

__all__ = ["PrivateRanges", "decrypted_file", "is_private", "load_verified", "open_private",
           "require_checked_models", "verify_fetched_later"]
