"""Model identity: what a KV cache (or adapter) is only valid for.

- :class:`ModelIdentity` and :func:`compare` / :func:`require_same`: pure logic, values in and
  out (``_identity``);
- :func:`fingerprint`: an identity computed from a loaded model, a local folder or a Hub id
  (``_fingerprint``, with the config and tokenizer fields in ``_config_fields`` and
  ``_tokenizer_fields``).
"""

from ._fingerprint import fingerprint
from ._identity import STRICT_FIELDS, ModelIdentity, compare, dtype_name, require_same

__all__ = ["STRICT_FIELDS", "ModelIdentity", "compare", "dtype_name", "fingerprint",
           "require_same"]
