"""Adversary #37 item 1 (env settings): the readers a server names in its environment.

Promise (docs/how-to/private-cubes.md "Private in MemOS"): ``install(recipients=[...])`` names
the readers of every dump, ``CUBEPACK_MEMOS_RECIPIENTS`` "for a server";
``CUBEPACK_MEMOS_STORES`` the databases. install()'s policy fields are read field by field:
what the call gives, over the environment (``replace(_from_environment(), **said)``).

Attack: a server sets ``CUBEPACK_MEMOS_RECIPIENTS`` (its own key: the only reader of its
dumps) and its code calls ``install(stores=[...])`` to name its database (or the reverse).

What happened: the privacy settings are read all or nothing: a call that gives ``stores``
drops the environment's recipients silently (and one that gives ``recipients`` drops
``CUBEPACK_MEMOS_STORES``). Dumps of an unsigned cube are then refused, and a trusted-signed
cube's dumps go to its manifest's readers rather than the ones the operator named: not whom
the server said. Either field by field, or a refusal naming the setting it ignores.
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pyrage = pytest.importorskip("pyrage")

import cubepack.memos as hook  # noqa: E402
from cubepack import UsageError  # noqa: E402
from cubepack.memos._privacy import RECIPIENTS_ENV, STORES_ENV, in_force  # noqa: E402


@pytest.mark.parametrize("given", ["stores", "recipients"])
def test_a_call_naming_one_privacy_setting_keeps_the_environments_other(given, monkeypatch):
    reader = str(pyrage.x25519.Identity.generate().to_public())
    store = "qdrant:/srv/memos/qdrant"
    monkeypatch.setenv(RECIPIENTS_ENV, reader)
    monkeypatch.setenv(STORES_ENV, f'["{store}"]')
    hook.uninstall()
    try:
        try:
            hook.install(require_pin=False, **({"stores": [store]} if given == "stores"
                                               else {"recipients": [reader]}))
        except UsageError:
            return  # refused, naming what it would ignore: also keeps the promise
        assert in_force().recipients == (reader,), "the environment's readers were dropped"
        assert in_force().stores == (store,), "the environment's stores were dropped"
    finally:
        hook.uninstall()
