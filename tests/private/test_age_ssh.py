"""SSH identities, natively (issue #37 item 2): for every identity type (age X25519,
ssh-ed25519, ssh-rsa, each SSH type passphrase-protected too, binary and armored files)
cubepack reads what Debian's ``age`` CLI wrote and the CLI reads what cubepack wrote, pyrage
agreeing where it can read the key; where a passphrase comes from, and that it is never
echoed; and malformed SSH stanzas, built from the spec's rules, refused as age refuses them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pty
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cubepack.errors import FormatError, RefusedError, UsageError
from cubepack.trust import _age as age
from cubepack.trust import _age_ssh as agessh
from cubepack.trust import _age_stream as stream

pyrage = pytest.importorskip("pyrage")
pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")
AGE = shutil.which("age")
needs_age = pytest.mark.skipif(AGE is None, reason="needs Debian's age CLI (apt-get install age)")
PASSPHRASE = "tr0ub4dor & 3"
#: identity type -> ssh-keygen's arguments (None: an age key) and its passphrase
TYPES = {"x25519": (None, None), "ssh-ed25519": (["-t", "ed25519"], None),
         "ssh-rsa": (["-t", "rsa", "-b", "2048"], None),
         "ssh-ed25519-passphrase": (["-t", "ed25519"], PASSPHRASE),
         "ssh-rsa-passphrase": (["-t", "rsa", "-b", "3072"], PASSPHRASE)}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """type -> (identity file, recipient text, passphrase)."""
    folder = tmp_path_factory.mktemp("sshkeys")
    found = {}
    for kind, (keygen, passphrase) in TYPES.items():
        path = folder / kind
        if keygen is None:
            identity = pyrage.x25519.Identity.generate()
            path.write_text(f"{identity}\n")
            os.chmod(path, 0o600)
            found[kind] = (path, str(identity.to_public()), None)
            continue
        subprocess.run(["ssh-keygen", "-q", *keygen, "-N", passphrase or "", "-C", "c@d",
                        "-f", str(path)], check=True)
        found[kind] = (path, path.with_suffix(".pub").read_text().strip(), passphrase)
    return found


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(age.PASSPHRASE_ENV, raising=False)
    monkeypatch.setattr(age, "_UNLOCKED", {})


def _identities(keys, kind, monkeypatch):
    path, _, passphrase = keys[kind]
    if passphrase:
        monkeypatch.setenv(age.PASSPHRASE_ENV, passphrase)
    return age.load_identities(path)


def _age_cli(args: list[str], passphrase: str | None) -> int:
    """Run the age CLI; a passphrase is typed on its terminal (age reads keys' passphrases
    from /dev/tty only), as a person would."""
    if passphrase is None:
        return subprocess.run([AGE, *args], capture_output=True).returncode
    pid, terminal = pty.fork()
    if pid == 0:
        os.execv(AGE, [AGE, *args])
    said, typed = b"", False
    while True:
        ready, _, _ = select.select([terminal], [], [], 30)
        if not ready:
            os.kill(pid, 9)
            break
        try:
            chunk = os.read(terminal, 1024)
        except OSError:
            break
        if not chunk:
            break
        said += chunk
        if not typed and b"passphrase" in said.lower().replace(b"-passphrase", b""):
            os.write(terminal, PASSPHRASE.encode() + b"\n")
            typed = True
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("armored", [False, True], ids=["binary", "armored"])
@pytest.mark.parametrize("kind", sorted(TYPES))
def test_cubepack_reads_what_the_age_cli_wrote(kind, armored, keys, tmp_path, monkeypatch):
    if AGE is None:
        pytest.skip("needs Debian's age CLI")
    data = os.urandom(3 * stream.CHUNK + 17)
    (tmp_path / "plain").write_bytes(data)
    subprocess.run([AGE, *(["-a"] if armored else []), "-r", keys[kind][1], "-o",
                    str(tmp_path / "f.age"), str(tmp_path / "plain")], check=True)
    ciphertext = (tmp_path / "f.age").read_bytes()
    assert bytes(age.decrypt(ciphertext, _identities(keys, kind, monkeypatch), "f")) == data


@needs_age
@pytest.mark.parametrize("kind", sorted(TYPES))
def test_the_age_cli_reads_what_cubepack_wrote(kind, keys, tmp_path):
    path, recipient, passphrase = keys[kind]
    data = os.urandom(2 * stream.CHUNK)
    (tmp_path / "f.age").write_bytes(age.encrypt(data, age.parse_recipients([recipient])))
    code = _age_cli(["-d", "-i", str(path), "-o", str(tmp_path / "out"),
                     str(tmp_path / "f.age")], passphrase)
    assert code == 0 and (tmp_path / "out").read_bytes() == data


@pytest.mark.parametrize("kind", ["ssh-ed25519", "ssh-rsa"])
def test_pyrage_and_cubepack_read_each_other(kind, keys, monkeypatch):
    path, recipient, _ = keys[kind]
    data = os.urandom(stream.CHUNK + 1)
    theirs = pyrage.ssh.Identity.from_buffer(path.read_bytes())
    ours = age.encrypt(data, age.parse_recipients([recipient]))
    assert pyrage.decrypt(bytes(ours), [theirs]) == data
    written = pyrage.encrypt(data, [pyrage.ssh.Recipient.from_str(recipient)])
    assert bytes(age.decrypt(written, _identities(keys, kind, monkeypatch), "f")) == data


def test_a_stanza_tag_is_the_sha256_of_the_keys_wire_encoding(keys):
    for kind in ("ssh-ed25519", "ssh-rsa"):
        recipient = keys[kind][1]
        wire = base64.b64decode(recipient.split()[1])
        head = bytes(age.encrypt(b"x", age.parse_recipients([recipient])))
        tag = base64.b64encode(hashlib.sha256(wire).digest()[:4]).rstrip(b"=")
        assert f"-> {kind} ".encode() + tag in head


def test_where_a_passphrase_comes_from(keys, tmp_path, monkeypatch):
    path = keys["ssh-ed25519-passphrase"][0]
    ciphertext = age.encrypt(b"secret", age.parse_recipients([keys["ssh-ed25519-passphrase"][1]]))
    # No terminal (this test's process has none under CI) and no variable: refused, naming both
    # ways a script has.
    if _has_terminal():
        pytest.skip("this process has a terminal: it would be asked")
    with pytest.raises(UsageError, match=age.PASSPHRASE_ENV) as refused:
        age.load_identities(path)
    assert "unlock_identity" in str(refused.value)
    monkeypatch.setenv(age.PASSPHRASE_ENV, "wrong")
    with pytest.raises(RefusedError, match="passphrase does not open") as wrong:
        age.load_identities(path)
    assert "wrong" not in str(wrong.value)
    monkeypatch.delenv(age.PASSPHRASE_ENV)
    age.unlock_identity(path, PASSPHRASE)  # the Python API: as ssh-add, for the process
    assert bytes(age.decrypt(ciphertext, age.load_identities(path), "f")) == b"secret"
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))  # the file changed:
    with pytest.raises(UsageError, match=age.PASSPHRASE_ENV):  # read, and asked, again
        age.load_identities(path)
    with pytest.raises(UsageError, match="not passphrase-protected"):
        age.unlock_identity(keys["ssh-ed25519"][0], "x")


def _has_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDWR))
    except OSError:
        return False
    return True


PROMPTED = r"""
import sys
from cubepack.trust import _age as age
identities = age.load_identities(sys.argv[1])
identities = age.load_identities(sys.argv[1])  # unlocked once: not asked twice
print("LOADED", len(identities), flush=True)
"""


def test_the_terminal_prompt_asks_once_and_never_echoes(keys):
    path = keys["ssh-rsa-passphrase"][0]
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUBEPACK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    pid, terminal = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-c", PROMPTED, str(path)], env)
    said, asked = b"", 0
    while True:
        ready, _, _ = select.select([terminal], [], [], 60)
        if not ready:
            os.kill(pid, 9)
            break
        try:
            chunk = os.read(terminal, 1024)
        except OSError:
            break
        if not chunk:
            break
        said += chunk
        if said.count(b"Enter passphrase for") > asked:
            asked += 1
            os.write(terminal, PASSPHRASE.encode() + b"\n")
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, said
    assert b"LOADED 1" in said and said.count(b"Enter passphrase for") == 1
    assert PASSPHRASE.encode() not in said


def test_an_rsa_key_under_2048_bits_is_refused_as_age_refuses_it(tmp_path):
    path = tmp_path / "small"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "1024", "-N", "", "-f", str(path)],
                   check=True)
    with pytest.raises(UsageError, match="2048"):
        age.parse_recipients([path.with_suffix(".pub").read_text()])


# --- malformed SSH stanzas: the spec's rules, age as the second opinion -----------------------

FILE_KEY = bytes(range(16))


def _file(stanza_lines: list[bytes]) -> bytes:
    """An age file of ``stanza_lines`` whose MAC and payload are right for FILE_KEY."""
    covered = b"\n".join([stream.VERSION_LINE, *stanza_lines]) + b"\n---"
    mac = hmac.new(stream._hkdf(FILE_KEY, b"", b"header"), covered, hashlib.sha256).digest()
    nonce = bytes(16)
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    payload = ChaCha20Poly1305(stream._hkdf(FILE_KEY, nonce, b"payload")).encrypt(
        stream._chunk_nonce(0, True), b"payload", None)
    return covered + b" " + stream._b64(mac) + b"\n" + nonce + payload


def _stanza(kind: str, recipient: str) -> tuple[list[bytes], bytes]:
    return age.parse_recipients([recipient])[0].value.wrap(FILE_KEY)


def _lines(args: list[bytes], body: bytes) -> list[bytes]:
    return stream._stanza_lines(args, body)


def _cases(keys) -> dict[str, tuple[list[bytes], str]]:
    """name -> (stanza lines, the outcome: success, format, refused, no match)."""
    ed_args, ed_body = _stanza("ssh-ed25519", keys["ssh-ed25519"][1])
    rsa_args, rsa_body = _stanza("ssh-rsa", keys["ssh-rsa"][1])
    other = bytes(32)
    return {
        "ed25519": (_lines(ed_args, ed_body), "success"),
        "ed25519 extra argument": (_lines([*ed_args, b"x"], ed_body), "format"),
        "ed25519 no share": (_lines(ed_args[:2], ed_body), "format"),
        "ed25519 short share": (_lines([*ed_args[:2], stream._b64(other[:31])], ed_body),
                                "format"),
        "ed25519 share not canonical": (
            _lines([*ed_args[:2], ed_args[2][:-1] + b"B" if not ed_args[2].endswith(b"B")
                    else ed_args[2][:-1] + b"C"], ed_body), "format"),
        "ed25519 low-order share": (_lines([*ed_args[:2], stream._b64(other)], ed_body),
                                    "format"),
        "ed25519 other tag": (_lines([ed_args[0], b"AAAAAA", ed_args[2]], ed_body), "no match"),
        "ed25519 body changed": (_lines(ed_args, bytes([ed_body[0] ^ 1]) + ed_body[1:]),
                                 "refused"),
        "rsa": (_lines(rsa_args, rsa_body), "success"),
        "rsa extra argument": (_lines([*rsa_args, b"x"], rsa_body), "format"),
        "rsa other tag": (_lines([rsa_args[0], b"AAAAAA"], rsa_body), "no match"),
        "rsa body changed": (_lines(rsa_args, bytes([rsa_body[0] ^ 1]) + rsa_body[1:]),
                             "refused"),
    }


def _outcome(data: bytes, identities) -> str:
    try:
        plain = age.decrypt(data, identities, "corpus")
    except FormatError:
        return "format"
    except RefusedError as exc:
        return "no match" if "not encrypted to the identity" in str(exc) else "refused"
    assert bytes(plain) == b"payload"
    return "success"


@pytest.mark.parametrize("kind", ["ssh-ed25519", "ssh-rsa"])
def test_malformed_ssh_stanzas_are_refused_as_the_spec_says(kind, keys, tmp_path, monkeypatch):
    identities = _identities(keys, kind, monkeypatch)
    for name, (lines, expected) in _cases(keys).items():
        if not name.startswith(kind[4:7]):
            continue
        data = _file(lines)
        assert _outcome(data, identities) == expected, name
        if AGE is not None:  # the second opinion: age accepts exactly what cubepack accepts
            (tmp_path / "f.age").write_bytes(data)
            theirs = subprocess.run([AGE, "-d", "-i", str(keys[kind][0]),
                                     str(tmp_path / "f.age")], capture_output=True)
            assert (theirs.returncode == 0) == (expected == "success"), (name, theirs.stderr)


def test_an_ed25519_recipient_is_its_keys_montgomery_form(keys, monkeypatch):
    """The birational map from Ed25519 to X25519 (RFC 7748's u = (1 + y) / (1 - y)) agrees
    with the X25519 public key of the scalar derived from the private key's seed."""
    [identity] = _identities(keys, "ssh-ed25519", monkeypatch)
    recipient = age.parse_recipients([keys["ssh-ed25519"][1]])[0].value
    assert isinstance(identity, agessh.Ed25519Identity)
    assert recipient.public == identity.public and recipient.tag == identity.tag


def test_the_cli_opens_a_cube_with_a_passphrase_protected_key(packed, keys, tmp_path):
    """``cubepack verify --identity KEY`` on a protected key: the passphrase from the
    variable (a script), and without it (no terminal here) refused, exit 2, naming it."""
    from helpers import cli_in_process

    from cubepack.ops._encrypt import encrypt

    if _has_terminal():
        pytest.skip("this process has a terminal: it would be asked")
    path, recipient, passphrase = keys["ssh-rsa-passphrase"]
    cube = tmp_path / "cube"
    shutil.copytree(packed, cube)
    encrypt(cube, [recipient])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUBEPACK_")}
    refused = cli_in_process(["verify", cube, "--identity", path], env=env, cwd=tmp_path)
    assert refused.returncode == 2 and age.PASSPHRASE_ENV in refused.stdout + refused.stderr
    opened = cli_in_process(["verify", cube, "--identity", path, "--json"],
                            env={**env, age.PASSPHRASE_ENV: passphrase}, cwd=tmp_path)
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert passphrase not in opened.stdout + opened.stderr


def test_a_public_key_given_as_the_identity_is_named_as_such(keys, tmp_path):
    for kind in ("ssh-ed25519", "x25519"):
        path = tmp_path / kind
        path.write_text(keys[kind][1] + "\n")
        os.chmod(path, 0o600)
        with pytest.raises(UsageError, match="holds a public key"):
            age.load_identities(path)
