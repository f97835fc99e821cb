"""``pull --local-dir`` keeps each byte once, as ``hf download --local-dir`` does (issue #40
item 5): the files are downloaded into the staging folder beside the target (huggingface_hub's
local-dir mode, its bookkeeping in ``.cache/huggingface/``), hashed there, verified, and only
then swapped in; the HF cache receives no file of the cube. An earlier pull at the target is
updated by hash: an unchanged file is linked into the staging folder and hashed by this process
(a record is a claim), never downloaded again. Bytes are counted from the process's own I/O
counters (``/proc/self/io`` ``write_bytes``: this machine's file system is ext4, which charges a
page to the task that dirties it), requests from the endpoint's."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

import cubepack
from cubepack.hub import pull, push
from cubepack.testing.blobs import write_safetensors_blob
from cubepack.testing.hub import InstrumentedHub

from helpers import tree_bytes

MIB = 1024 * 1024
PARTS = 3
CHANGED = "data/part-1.safetensors"


def write_bytes() -> int:
    """Bytes this process (every thread) has caused to be written to a block device."""
    with open("/proc/self/io") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["write_bytes"])


def make_cube(folder: Path, *, changed: bool = False) -> Path:
    block = random.Random(0).randbytes(MIB)  # v1 and v2 share every file but CHANGED
    for index in range(PARTS):
        seed = index + (100 if changed and f"data/part-{index}.safetensors" == CHANGED else 0)
        write_safetensors_blob(folder / "data" / f"part-{index}.safetensors", 8 * MIB,
                               seed=seed, block=block)
    (folder / "config.json").write_text('{"cube_id": "ns/big"}')
    cubepack.pack(folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-dir")
    with InstrumentedHub(root / "hub-root") as server:
        first = make_cube(root / "v1")
        server.v1 = push(first, "ns/big", endpoint=server.url).commit_sha
        second = make_cube(root / "v2", changed=True)
        server.v2 = push(second, "ns/big", endpoint=server.url).commit_sha
        server.size = sum(path.stat().st_size for path in first.rglob("*") if path.is_file())
        yield server


def do_pull(hub, target, sha, tmp_path, **kwargs):
    kwargs.setdefault("cache_dir", tmp_path / "hf-cache")
    return pull(f"ns/big@{sha}", endpoint=hub.url, local_dir=target, progress=False, **kwargs)


def cached_files(tmp_path) -> list[str]:
    """The HF cache's files (its blobs, snapshots' links), without the refs a pull records."""
    root = tmp_path / "hf-cache"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if (p.is_file() or p.is_symlink()) and "/refs/" not in p.as_posix())


def gets(hub, name: str) -> int:
    return sum(count for key, count in hub.stats.requests.items()
               if key.startswith("GET ") and "/resolve/" in key and key.endswith(name))


def test_a_pull_writes_each_byte_once(hub, tmp_path):
    before = write_bytes()
    result = do_pull(hub, tmp_path / "out", hub.v1, tmp_path)
    written = write_bytes() - before
    assert result.report.ok
    assert written <= 1.02 * hub.size, f"{written} bytes written for a {hub.size}-byte cube"
    assert cached_files(tmp_path) == []  # the one copy is the folder's


def test_an_update_downloads_and_writes_only_what_changed(hub, tmp_path):
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    kept = {name: os.stat(target / name).st_ino for name in tree_bytes(target)
            if name.startswith("data/") and name != CHANGED}
    hub.stats.reset()
    before = write_bytes()
    result = do_pull(hub, target, hub.v2, tmp_path)
    written = write_bytes() - before
    assert result.report.ok and result.commit_sha == hub.v2
    assert gets(hub, CHANGED) == 1
    assert all(gets(hub, name) == 0 for name in kept), hub.stats.requests  # never downloaded again
    changed_size = os.stat(target / CHANGED).st_size
    assert written <= changed_size + 0.02 * hub.size, written
    # The unchanged files are the very files the earlier pull placed, now of this one only.
    for name, inode in kept.items():
        st = os.stat(target / name)
        assert st.st_ino == inode and st.st_nlink == 1
    assert cubepack.verify(target).ok


def tree_inodes(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_nlink)
            for p in folder.rglob("*") if p.is_file()}


def leftovers(tmp_path) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]


# --- offline: the folder's own bookkeeping, else the HF cache ------------------------------------

def test_an_offline_pull_is_served_from_the_folder_it_updates(hub, tmp_path):
    """HF_HUB_OFFLINE=1 pull of REPO@REV into the folder an earlier pull of that commit placed:
    zero requests, no cube byte written, every file hashed and verified again."""
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    before = tree_bytes(target)
    hub.stats.reset()
    start = write_bytes()
    result = do_pull(hub, target, hub.v1, tmp_path, offline=True)
    written = write_bytes() - start
    assert result.report.ok and result.commit_sha == hub.v1
    assert sum(hub.stats.requests.values()) == 0
    assert written <= 0.02 * hub.size, written
    def kept(files):  # huggingface_hub's records stay; its empty lock files come and go
        return {name: data for name, data in files.items()
                if name != ".cache/cubepack/origin.json" and not name.endswith(".lock")}

    assert kept(tree_bytes(target)) == kept(before) and cached_files(tmp_path) == []


def test_an_offline_pull_hashes_the_folder_whatever_its_records_say(hub, tmp_path):
    """A file edited in the folder, and its origin record rewritten to match the edit (stat key
    and sha256): the lock still refuses it, and the folder stays as it was."""
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    name = "data/part-2.safetensors"
    with open(target / name, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    forge_origin(target, name)
    before = tree_bytes(target)
    with pytest.raises(cubepack.VerificationFailed) as caught:
        do_pull(hub, target, hub.v1, tmp_path, offline=True)
    assert [(f.name, f.subject) for f in caught.value.failures] == [("sha256", name)]
    assert tree_bytes(target) == before and not leftovers(tmp_path)


def test_an_offline_pull_into_another_folder_needs_the_hf_cache_and_the_fix_works(hub, tmp_path):
    from huggingface_hub import snapshot_download

    do_pull(hub, tmp_path / "out", hub.v1, tmp_path)
    with pytest.raises(cubepack.HubError) as caught:
        do_pull(hub, tmp_path / "other", hub.v1, tmp_path, offline=True)
    message = str(caught.value)
    assert f"neither at {tmp_path / 'other'}" in message and "nor in the HF cache" in message
    assert f"hf download ns/big --repo-type dataset --revision {hub.v1}" in message
    assert not (tmp_path / "other").exists()
    # As it says (the hf CLI's download into the HF cache is snapshot_download's).
    snapshot_download("ns/big", repo_type="dataset", revision=hub.v1, endpoint=hub.url,
                      cache_dir=tmp_path / "hf-cache")
    hub.stats.reset()
    assert do_pull(hub, tmp_path / "other", hub.v1, tmp_path, offline=True).report.ok
    assert sum(hub.stats.requests.values()) == 0


def forge_origin(target: Path, name: str, sha256: str | None = None) -> None:
    """Rewrite the origin record's entry for ``name`` to claim ``sha256`` (default: the file's
    digest now) with the file's current stat key: the record then vouches for whatever it is."""
    import json

    from cubepack._util import hashing
    from cubepack.hub import _pull

    path = target / ".cache/cubepack/origin.json"
    origin = json.loads(path.read_text())
    st = os.lstat(target / name)
    origin["files"][name] = {"sha256": sha256 or hashing.sha256_file(target / name),
                             "size": st.st_size, "stat": _pull._stat_key(st)}
    path.write_text(json.dumps(origin))


# --- records are claims: hashed before they count -------------------------------------------------

def locked_sha256(hub, sha: str, name: str, tmp_path) -> str:
    from huggingface_hub import hf_hub_download

    from cubepack.format import _lock

    lock = hf_hub_download("ns/big", "cubepack.lock", repo_type="dataset", revision=sha,
                           endpoint=hub.url, local_dir=tmp_path / f"lock-{sha[:8]}")
    return _lock.parse(Path(lock).read_bytes()).files[name].sha256


def test_an_origin_record_claiming_the_new_bytes_is_hashed_before_it_counts(hub, tmp_path):
    """The earlier pull's record says part-2 already holds what v2 wants, and matches the file's
    stat key (so the folder check believes it unchanged): the pull hashes it and finds
    otherwise; the file is downloaded, never reused."""
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    name = "data/part-2.safetensors"
    with open(target / name, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    forge_origin(target, name, locked_sha256(hub, hub.v2, name, tmp_path))
    hub.stats.reset()
    before = tree_bytes(target)
    # Hashed, the file is not what its record says: an edit the stat key did not show, so
    # the pull will not replace it unasked, and places nothing.
    with pytest.raises(cubepack.UsageError, match=re.escape(f"{name} (changed)")):
        do_pull(hub, target, hub.v2, tmp_path)
    assert tree_bytes(target) == before and not leftovers(tmp_path)
    hub.stats.reset()
    assert do_pull(hub, target, hub.v2, tmp_path, force=True).report.ok
    assert gets(hub, name) == 1 and gets(hub, "part-0.safetensors") == 0
    assert cubepack.verify(target).ok


def test_huggingface_hub_records_are_claims_too(hub, tmp_path):
    """A folder ``hf download --local-dir`` made, pulled into with --force: its records' LFS
    sha256 name the files worth hashing; a record lying about an edited file is caught by the
    hash and that file downloaded; the others are not downloaded again."""
    from huggingface_hub import snapshot_download

    target = tmp_path / "out"
    snapshot_download("ns/big", repo_type="dataset", revision=hub.v1, endpoint=hub.url,
                      local_dir=target)
    name = "data/part-0.safetensors"
    with open(target / name, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    record = target / ".cache/huggingface/download" / f"{name}.metadata"
    lines = record.read_text().splitlines()
    record.write_text(f"{lines[0]}\n{lines[1]}\n9999999999.0\n")  # "current", says the record
    hub.stats.reset()
    assert do_pull(hub, target, hub.v1, tmp_path, force=True).report.ok
    assert gets(hub, name) == 1
    assert gets(hub, "part-1.safetensors") == 0 and gets(hub, "part-2.safetensors") == 0
    assert cubepack.verify(target).ok


def test_hf_download_on_a_pulled_folder_downloads_nothing_and_a_later_pull_still_updates(
        hub, tmp_path):
    """The records a pull leaves are huggingface_hub's own: ``hf download --local-dir`` finds
    the folder current; what it adds there (its tree listing) loses nothing to a later pull."""
    from huggingface_hub import snapshot_download

    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    hub.stats.reset()
    snapshot_download("ns/big", repo_type="dataset", revision=hub.v1, endpoint=hub.url,
                      local_dir=target)
    assert not [key for key in hub.stats.requests if "/resolve/" in key]
    assert do_pull(hub, target, hub.v2, tmp_path).report.ok


# --- a failed update leaves the folder as it was --------------------------------------------------

def test_a_failed_update_leaves_the_folder_and_its_files_as_they_were(hub, tmp_path):
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    before, inodes = tree_bytes(target), tree_inodes(target)
    fault = hub.add_fault("corrupt", path=rf"/resolve/.*{CHANGED}", method="GET")
    with pytest.raises(cubepack.VerificationFailed) as caught:
        do_pull(hub, target, hub.v2, tmp_path)
    assert fault.hits == 1
    assert [(f.name, f.subject) for f in caught.value.failures] == [("sha256", CHANGED)]
    assert tree_bytes(target) == before and tree_inodes(target) == inodes  # nlink 1 again
    assert not leftovers(tmp_path) and cached_files(tmp_path) == []
    assert do_pull(hub, target, hub.v2, tmp_path).report.ok


def test_an_edit_to_a_reused_file_during_the_update_is_refused_and_kept(hub, tmp_path):
    """An unchanged file is linked into the staging folder (the same inode): an edit made to it
    in the folder while the pull downloads is seen before anything is placed, refused, and the
    user's bytes stay."""
    import threading

    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    hold = hub.add_fault("hold", path=rf"/resolve/.*{CHANGED}", method="GET")
    outcome = {}

    def run():
        try:
            do_pull(hub, target, hub.v2, tmp_path)
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert hub.wait_for_request(rf"^GET .*/resolve/.*{CHANGED}")
        with open(target / "data/part-0.safetensors", "r+b") as handle:
            handle.write(b"mine")
        edited = (target / "data/part-0.safetensors").read_bytes()
    finally:
        hold.release()
        thread.join()
    error = outcome.get("error")
    assert isinstance(error, cubepack.UsageError), error
    assert "data/part-0.safetensors (changed)" in str(error)
    assert (target / "data/part-0.safetensors").read_bytes() == edited
    assert os.stat(target / "data/part-0.safetensors").st_nlink == 1 and not leftovers(tmp_path)


@pytest.mark.parametrize("planted", [".cache/huggingface/download/config.json.metadata",
                                     ".cache/cubepack/origin.json"])
def test_a_commit_holding_bookkeeping_paths_is_refused_before_any_download(hub, tmp_path,
                                                                          planted):
    """A commit that ships a download's records (``.cache/huggingface/download/*.metadata``,
    an origin record) would write where the pull keeps its own, and vouch for files: refused
    before any download, naming the path. Neither the client nor the endpoint uploads such
    paths, so the commit is forged in the store, as a hostile endpoint would serve it."""
    from cubepack.localhub._store import repo_ref

    repo = repo_ref("datasets", "ns", "big")
    tree = dict(hub.store.commit(repo, hub.v1)["tree"])
    tree[planted] = tree["config.json"]
    forged = hub.store._write_commit(repo, parents=[hub.v1], tree=tree, title="forged",
                                     message="")
    hub.stats.reset()
    with pytest.raises(cubepack.UnsafeInputError, match=re.escape(planted)):
        do_pull(hub, tmp_path / "out", forged, tmp_path)
    assert not [key for key in hub.stats.requests if "/resolve/" in key]
    assert not (tmp_path / "out").exists()


# --- the CLI (--json) and private cubes keep every guarantee --------------------------------------

CLI = ("import sys\nfrom cubepack.cli import main\ncode = main(sys.argv[1:])\n"
       "sys.stderr.write(open('/proc/self/io').read())\nsys.exit(code)\n")


def cli(hub, tmp_path, *args, **env):
    """``cubepack ARGS`` in a process of its own (the client alone: the endpoint runs in this
    one), which reports its own write_bytes last."""
    import json
    import subprocess
    import sys

    environ = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hf-cache"),
                   HF_HUB_DISABLE_PROGRESS_BARS="1", **env)
    done = subprocess.run([sys.executable, "-c", CLI, *map(str, args)], env=environ,
                          capture_output=True, text=True, timeout=300, check=False)
    written = int(done.stderr.rsplit("write_bytes: ", 1)[1].split()[0])
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else None, written


def test_the_cli_pulls_updates_and_pulls_offline_with_json_each_byte_once(hub, tmp_path):
    target = tmp_path / "out"
    code, first, written = cli(hub, tmp_path, "pull", f"ns/big@{hub.v1}", "--local-dir", target,
                               "--json")
    assert code == 0 and first["commit_sha"] == hub.v1 and first["verified"]
    assert written <= 1.02 * hub.size, written
    code, second, written = cli(hub, tmp_path, "pull", f"ns/big@{hub.v2}", "--local-dir",
                                target, "--json")
    assert code == 0 and second["commit_sha"] == hub.v2 and second["verified"]
    assert written <= os.stat(target / CHANGED).st_size + 0.02 * hub.size, written
    hub.stats.reset()
    code, offline, written = cli(hub, tmp_path, "pull", f"ns/big@{hub.v2}", "--local-dir",
                                 target, "--json", HF_HUB_OFFLINE="1")
    assert code == 0 and offline["commit_sha"] == hub.v2 and offline["verified"]
    assert written <= 0.02 * hub.size and sum(hub.stats.requests.values()) == 0
    assert cached_files(tmp_path) == []


def test_a_private_cube_is_updated_in_place_and_pulled_offline_with_its_key(
        tmp_path, packed_cube_factory):
    """A private repo holding an encrypted cube: pulled with a token and an identity, pulled
    again (no ciphertext downloaded again: each hashed where it is), then offline from the
    folder, each time decrypted in memory and verified; without a token it is not found."""
    import shutil

    pyrage = pytest.importorskip("pyrage", reason="private cubes need cubepack[private]")
    from cubepack.ops._encrypt import encrypt

    from data import HUB_TOKEN

    identity = pyrage.x25519.Identity.generate()
    key = tmp_path / "alice.key"
    key.write_text(f"{identity}\n")
    os.chmod(key, 0o600)
    cube = tmp_path / "private"
    shutil.copytree(packed_cube_factory(), cube)
    encrypt(cube, [str(identity.to_public())])
    target = tmp_path / "out"
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        sha = push(cube, "ns/secret", endpoint=hub.url, private=True, allow_local_paths=True,
                   token=HUB_TOKEN).commit_sha

        def pull_private(token=HUB_TOKEN, **kwargs):
            return pull(f"ns/secret@{sha}", endpoint=hub.url, token=token, local_dir=target,
                        cache_dir=tmp_path / "hf-cache", decrypt_with=key, progress=False,
                        **kwargs)

        first = pull_private()
        assert first.report.ok and any(c.name == "kv header" and c.ok
                                       for c in first.report.checks)
        hub.stats.reset()
        assert pull_private().report.ok
        assert [k for k in hub.stats.requests if k.startswith("GET ") and "/resolve/" in k]
        assert not [k for k in hub.stats.requests if k.startswith("GET ") and k.endswith(".age")]
        hub.stats.reset()
        assert pull_private(offline=True).report.ok and sum(hub.stats.requests.values()) == 0
        with pytest.raises(cubepack.HubError, match="private and no valid token"):
            pull(f"ns/secret@{sha}", endpoint=hub.url, token=False, local_dir=tmp_path / "x",
                 cache_dir=tmp_path / "hf-cache")
    assert cached_files(tmp_path) == []


def test_a_reused_file_the_user_hard_linked_elsewhere_is_placed_as_the_folders_own(hub, tmp_path):
    """``ln out/data/part-0.safetensors backup``: the update must not leave the placed file
    sharing its inode with the user's other name (an edit of one would change the other)."""
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    backup = tmp_path / "backup.safetensors"
    os.link(target / "data/part-0.safetensors", backup)
    kept = backup.read_bytes()
    assert do_pull(hub, target, hub.v2, tmp_path).report.ok
    placed = os.stat(target / "data/part-0.safetensors")
    assert placed.st_ino != os.stat(backup).st_ino and placed.st_nlink == 1
    with open(target / "data/part-0.safetensors", "r+b") as handle:
        handle.write(b"edit")
    assert backup.read_bytes() == kept


def test_an_update_past_its_deadline_leaves_the_folder_and_no_staging_behind(hub, tmp_path):
    target = tmp_path / "out"
    do_pull(hub, target, hub.v1, tmp_path)
    before, inodes = tree_bytes(target), tree_inodes(target)
    hold = hub.add_fault("hold", path=rf"/resolve/.*{CHANGED}", method="GET")
    try:
        with pytest.raises(cubepack.HubError, match="deadline|timeout|seconds"):
            do_pull(hub, target, hub.v2, tmp_path, timeout=3)
    finally:
        hold.release()
    assert tree_bytes(target) == before and tree_inodes(target) == inodes
    assert not leftovers(tmp_path)
