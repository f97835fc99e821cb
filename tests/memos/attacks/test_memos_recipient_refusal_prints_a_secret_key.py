"""Adversary #37 item 1 (recipients as garbage): the refusals of a bad recipient.

Promise (SECURITY.md, trust/_age.load_identities): a key file's content "never appears in a
message"; principle 1: the suggested fix works where the error is met. The hook takes readers
from ``install(recipients=[...])``, ``init_from_dir(..., recipients=[...])`` and
``CUBEPACK_MEMOS_RECIPIENTS`` (a server's environment, whose errors land in its logs).

Attack: (a) name an age secret key where a recipient belongs (an easy slip: both are one line
of the same key file); (b) name a recipients file that is empty, or only comments.

What happened: (a) the refusal quotes the first 40 characters of the secret,
"Recipient 'AGE-SECRET-KEY-1<24 characters of the key>' is not an age recipient", into the
exception (and the server's log); (b) the refusal says "name at least one (--encrypt-to /
--to: ...)", CLI flags that do not exist for ``install()``, and does not name the file.
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pyrage = pytest.importorskip("pyrage")

import cubepack.memos as hook  # noqa: E402
from cubepack import UsageError  # noqa: E402


def test_a_secret_key_named_as_a_recipient_is_not_echoed(tmp_path):
    secret = str(pyrage.x25519.Identity.generate())
    body = secret[len("AGE-SECRET-KEY-1"):]
    hook.uninstall()
    try:
        with pytest.raises(UsageError) as refused:
            hook.install(require_pin=False, recipients=[secret])
    finally:
        hook.uninstall()
    shown = [body[i:i + 8] for i in range(0, len(body) - 8, 8) if body[i:i + 8] in
             str(refused.value)]
    assert shown == [], f"the refusal prints the secret key: {str(refused.value)[:60]}"


@pytest.mark.parametrize("content", ["", "# readers of my dumps\n"])
def test_an_empty_recipients_file_is_named_with_a_fix_for_install(tmp_path, content):
    path = tmp_path / "readers.txt"
    path.write_text(content)
    hook.uninstall()
    try:
        with pytest.raises(UsageError) as refused:
            hook.install(require_pin=False, recipients=[str(path)])
    finally:
        hook.uninstall()
    message = str(refused.value)
    assert str(path) in message and "--encrypt-to" not in message, message
