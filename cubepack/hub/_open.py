"""Memories on demand (issue #40): :func:`open_cube` (``cubepack.open("owner/cube@REV")``)
resolves a branch or tag to its commit once, with one HEAD of the lock (a 40-hex commit is not
resolved: the lock fetched at it proves it), then fetches the lock at that commit and checks it
(its size, strict JSON, version, sections, both digests): two requests at a branch, one at a
commit, the lock's bytes and no more. :meth:`RemoteCube.load` then fetches the memory's
shard index (once a shard; checked against the lock's sha256 and size before it is parsed, and
against the lock's entry after, read for that memory: ``shards.MemoryReader`` states which
checks decide one memory's load) and the memory's byte range, both by HTTP Range on the resolve
URL at that commit (each answer must be ``206`` with the ``Content-Range`` asked for), checks
the range's sha256 and its KV header's checksums against the index before any tensor is built,
and hands it to the activations kind's load, which checks its producer against the model.
:meth:`RemoteCube.place` writes every file but the memories into a folder (what the MemOS hook's
load on first use verifies, the files' bytes against the lock, before it builds anything).

What the lock says is the claim of whoever pushed last: its digests bind the shards and
indexes to the lock, not the lock to a person. With ``trusted_keys``, ``open`` also fetches the
signature and its attestation at the commit and checks the signature over the lock (its
manifest rebuilt from the lock's digests: :func:`~cubepack.trust._signing.verify_lock_signature`)
before any memory is fetched; the attestation's statements are not read here (pull and verify
for the labels a signer proved). A cube signed over its memories but not this lock (compacted
since signing: a version-4 attestation of another lock) is refused, naming ``compact
--sign-key``: its memories' digest needs every shard index, which would break open's budget.

A private cube opens the same way (its public lock, and its signature); a memory of it is
loaded with ``decrypt_with`` (:meth:`RemoteCube.load`): the encrypted manifest is fetched whole
once, then only the memory's index and its chunks (``ops/_private_range.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from .._util.paths import resolve_inside
from ..errors import FormatError, HubError, RefusedError, SignatureError, UsageError
from ..format import _lock as lockfile
from ..format import _partial as partialformat
from ..format.sections import Activation, Lock, Locator, ShardIndex
from ..format.sections import shards as shardformat
from ..kinds import serving
from ..kinds.activations._shards import checked_range
from ..ops._seam import PrivateRanges
from ..trust._generation import seen_check
from ..trust._policy import TrustPolicy
from ..trust._attestation import signs_another_lock
from ..trust._signing import verify_lock_signature
from ._client import REPO_TYPES, HubClient, offline_requested, parse_repo_spec

#: The largest lock ``open`` fetches: the lock's own parse limit.
MAX_LOCK_BYTES = lockfile.MAX_LOCK_BYTES
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass
class RemoteCube:
    """A cube on a Hub, opened at one commit: its lock (checked), and its memories loaded one
    at a time (:meth:`load`), each fetched by range and checked before it is built."""

    repo_id: str
    repo_type: str
    commit: str
    lock: Lock
    client: HubClient = field(repr=False)
    #: the trusted key whose signature over the lock verified (``trusted_keys``), or None
    signed_by: str | None = None
    #: shard path -> its index, fetched and checked once
    indexes: dict[str, ShardIndex] = field(default_factory=dict, repr=False)
    #: the lock's bytes as fetched and checked (what a reader that verifies a folder writes)
    lock_bytes: bytes = field(default=b"", repr=False)
    #: a private cube's manifest decrypted, by identity file (its clear lock, its ranges)
    private: dict[str, PrivateRanges] = field(default_factory=dict, repr=False)
    #: shard path -> its index read for one memory at a time (fetched and checked once)
    readers: dict[str, shardformat.MemoryReader] = field(default_factory=dict, repr=False)

    @property
    def memories(self) -> int:
        """How many activation memories the cube holds (its lock's count: no index fetched;
        a private cube's public lock counts them)."""
        if self.lock.encryption is not None:
            return self.lock.encryption.counts.of("activations")
        return shardformat.activation_count(self.lock)

    def entry(self, item_id: str) -> Activation:
        """The memory ``item_id``'s entry: the lock's, or its shard index's (fetched once).

        Raises:
            UsageError: the cube holds no memory of that id (or ``item_id`` is no string).
            FormatError: its shard's index is not the lock's, or disagrees with it, or lists
                a memory the lock lists too.
        """
        if self.lock.private:
            raise UsageError(f"{self.repo_id}@{self.commit[:12]} is a private cube: its "
                             "entries are in its encrypted manifest and indexes; load a memory "
                             "with load(item, model, decrypt_with=IDENTITY_FILE).")
        entry = self.find(item_id)
        if entry is None:
            raise UsageError(f"{self.repo_id}@{self.commit} holds no activation memory "
                             f"{item_id!r} ({self.memories} memories).")
        return entry

    def ids(self) -> list[str]:
        """Every activation memory's id, in order: the lock's, and each shard index's (each
        index fetched once, checked against the lock; no memory's bytes are fetched). A shard
        whose index cannot be fetched or is refused names its range of memories."""
        held: dict[str, Activation] = {}
        for shard in self.lock.shards.values():
            try:
                index = self._index(shard)
            except (HubError, FormatError) as exc:  # name the memories it would have listed
                raise type(exc)(f"the memories {shard.first!r} to {shard.last!r} of "
                                f"{self.repo_id}@{self.commit[:12]} cannot be listed: "
                                f"{exc}") from exc
            shardformat.add_memories(held, index, self.lock)
        return sorted({*self.lock.activations, *held})

    def find(self, item_id: Any) -> Activation | None:
        """The memory ``item_id``'s entry, or None: its shard's index read for this memory
        (``format.sections.shards.MemoryReader`` states which of the index's
        checks decide one memory's load; ``verify`` and ``pull`` make them all), unless the
        whole index was read already (:meth:`ids`).

        Raises:
            UsageError: ``item_id`` is no string.
            FormatError: its shard's index is not the lock's, disagrees with it, or lists
                the memory twice (or the lock too).
        """
        def index_of(shard: shardformat.Shard) -> ShardIndex:
            if shard.path in self.indexes:
                return self.indexes[shard.path]
            if shard.path not in self.readers:
                self.readers[shard.path] = shardformat.load_reader(shard, self.fetch,
                                                                   self.lock.models)
            return self.readers[shard.path].memory(item_id)
        return shardformat.find_memory(self.lock, item_id, index_of)

    def _index(self, shard: shardformat.Shard) -> ShardIndex:
        if shard.path in self.readers:  # its bytes fetched for a load: checked whole, here
            self.indexes[shard.path] = self.readers.pop(shard.path).whole()
        if shard.path not in self.indexes:
            self.indexes[shard.path] = shardformat.load_index(shard, self.fetch,
                                                              self.lock.models)
        return self.indexes[shard.path]

    def load(self, item_id: str, model: Any, policy: TrustPolicy | None = None, *,
             device: Any = None, copy: bool = False, identity: Any = None,
             decrypt_with: Any = None, **options: Any) -> Any:
        """The memory ``item_id`` as a ``DynamicCache`` for ``model``: its index and its byte
        range fetched at the opened commit, its sha256 and checksums checked against its
        index (the index against the lock) before any tensor is built, its producer against
        ``model`` (``IdentityMismatch`` otherwise); ``policy``/``options`` as for
        ``cubepack.load_kv_cache`` (``recompute=True`` proves it with ``model``).

        A private cube's memory needs ``decrypt_with`` (an identity file; ``identity`` names
        the live model's identity, as in ``load_kv_cache``): the encrypted manifest is fetched
        and decrypted (once an identity), then the memory's shard index and the 64 KiB chunks
        its range lies in, each by one ranged GET (a shard's age header once a shard, one more
        unless the memory starts in its first chunk), each chunk's tag checked, then its sha256
        and checksums against its index (:mod:`cubepack.ops._private_range` states the chain).

        Raises:
            IntegrityError: the range's bytes are not the ones the index records; a private
                chunk fails its tag, or a header is not the one the manifest records.
            IdentityMismatch: another model produced it.
            HubError: the endpoint did not answer the range as asked.
            UsageError: a private cube without ``decrypt_with`` (or a clear one with it).
        """
        policy = TrustPolicy.build(policy, **options)
        policy.require_honoured("load_kv_cache")
        if self.lock.private or decrypt_with is not None:
            source = self._private(decrypt_with)
            return serving("load_kv_cache").load(
                f"{self.repo_id}@{self.commit[:12]}", model, policy.recomputation(),
                device=device, copy=copy, identity=identity, item=item_id, source=source)
        entry = self.entry(item_id)
        data = self.memory_bytes(entry)
        name = f"{self.repo_id}@{self.commit[:12]}/{entry.file}#{item_id}"
        return serving("load_kv_cache").load(name, model, policy.recomputation(), device=device,
                                             copy=copy, identity=identity, data=data)

    def memory_bytes(self, entry: Activation) -> bytearray:
        """The memory ``entry``'s bytes at the opened commit (its range, or its whole file),
        checked against its index's (or lock's) sha256 and checksums before anything reads
        them (IntegrityError otherwise, naming the memory)."""
        return checked_range(entry, bytearray(self.fetch(entry.locator)))

    def _private(self, decrypt_with: Any) -> PrivateRanges:
        """The private cube's ranges, its manifest decrypted with ``decrypt_with`` (once)."""
        if decrypt_with is None:
            raise UsageError(f"{self.repo_id}@{self.commit[:12]} is a private cube: its "
                             "memories are encrypted. Pass decrypt_with=IDENTITY_FILE (an age "
                             "or OpenSSH key it is encrypted to).")
        key = str(decrypt_with)
        if key not in self.private:
            self.private[key] = PrivateRanges(
                self.lock, lambda name, offset, length: self.fetch(
                    Locator(name, offset, length, "")), decrypt_with,
                f"{self.repo_id}@{self.commit[:12]}")
        return self.private[key]

    def place(self, folder: Path) -> list[str]:
        """Write into ``folder`` the lock (the bytes :func:`open_cube` checked) and every file
        of it but its activation memories (their KV files, shards and indexes: what a partial
        cube may lack, :func:`~cubepack.format._partial.memory_files`), each fetched at the
        opened commit as the lock's size (temp file, then rename); the lock last, so a folder
        left by a failure is no cube. Their bytes are checked against the lock by verify of
        the folder, the one checker, before anything parses them. Returns the paths written.

        Raises:
            UsageError: a private cube (its memories are inside its ciphertexts' manifest).
            HubError: as :meth:`fetch`.
        """
        if self.lock.private:
            raise UsageError(f"{self.repo_id}@{self.commit[:12]} is a private cube: its files "
                             "are ciphertexts and its memories are not files of its lock, so "
                             "they cannot be left out. Pull it whole (cubepack pull --identity).")
        placed = []
        memories = partialformat.memory_files(self.lock)
        for name, listed in sorted(self.lock.files.items()):
            if name in memories:
                continue
            data = self.fetch(listed.locator) if listed.size else b""
            target = resolve_inside(folder, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_bytes(target, data)
            placed.append(name)
        atomic.write_bytes(folder / constants.LOCK_FILENAME, self.lock_bytes)
        return [*placed, constants.LOCK_FILENAME]

    def fetch(self, locator: Locator) -> bytes:
        """``locator``'s bytes of the file at the opened commit, by one ranged GET: refused
        unless the answer is 206 with exactly the ``Content-Range`` asked for (the file's size
        the lock's) and as many bytes; refused without a request under ``HF_HUB_OFFLINE``."""
        if offline_requested():  # the session may predate HF_HUB_OFFLINE: asked here
            raise HubError(f"HF_HUB_OFFLINE is set: {locator.path} of {self.repo_id}@"
                           f"{self.commit[:12]} is not here and was not fetched; go online, "
                           f"or pull the cube while online (cubepack pull {self.repo_id} "
                           f"--revision {self.commit}).")
        listed = self.lock.files.get(locator.path)
        if listed is None:
            raise FormatError(f"{locator.path} is not a file of the lock of "
                              f"{self.repo_id}@{self.commit}.")
        first, last = locator.offset, locator.end - 1
        response = self._get(locator.path, {"Range": f"bytes={first}-{last}"})
        where = f"{self.client.endpoint} for {self.repo_id}@{self.commit[:12]}/{locator.path}"
        if response.status_code != 206:
            raise HubError(f"{where} answered a byte range with {response.status_code}, not "
                           "206 Partial Content: the endpoint does not serve ranges, so one "
                           "memory cannot be fetched alone; pull the cube instead.")
        stated = response.headers.get("Content-Range", "")
        found = _CONTENT_RANGE.fullmatch(stated.strip())
        if found is None or tuple(map(int, found.groups())) != (first, last, listed.size):
            raise HubError(f"{where} answered the range bytes {first}-{last} of "
                           f"{listed.size} with Content-Range {stated!r}: not the range asked "
                           "for; nothing was loaded.")
        body = response.content
        if len(body) != locator.length:
            raise HubError(f"{where} sent {len(body)} bytes for a {locator.length}-byte range; "
                           "nothing was loaded.")
        return body

    def _get(self, path: str, headers: dict[str, str], *, head: bool = False) -> Any:
        return _request(self.client, self.repo_id, self.repo_type, self.commit, path, headers,
                        head=head)


def open_cube(repo: str, *, revision: str | None = None, repo_type: str = "dataset",
              endpoint: str | None = None, token: str | bool | None = None,
              trusted_keys: list[str] | None = None) -> RemoteCube:
    """Open the cube ``repo`` (``owner/name[@revision]``) on a Hub without downloading it:
    its revision resolved once to a commit (every later fetch uses that commit), its lock
    fetched at that commit and checked (size, strict JSON, version, sections, digests).
    Memories are loaded one at a time with :meth:`RemoteCube.load`. ``trusted_keys``: public
    keys (PEM), one of which must have signed this lock (its signature and attestation fetched
    at the commit: two more requests).

    Raises:
        SignatureError: ``trusted_keys`` given and the cube unsigned, signed by another key, or
            signed over another lock.
        RefusedError: a private cube signed by a trusted key at a generation older than one
            this client has seen of it (a replay; its generation is recorded otherwise, as a
            verify records it).
        HubError: the repo, the revision or its lock cannot be fetched.
        FormatError: the lock is malformed, too large, or its digests do not match.

    Returns:
        a :class:`RemoteCube`.

    Example:
        ```python
        cube = cubepack.open_cube("alice/travel-notes@main")  # cubepack.open is the same
        cache = cube.load("item-1", model)
        ```
    """
    repo_id, wanted = parse_repo_spec(repo, revision)
    if repo_type not in REPO_TYPES:
        raise UsageError(f"repo_type must be one of {', '.join(REPO_TYPES)}, not {repo_type!r}.")
    client = HubClient(endpoint, token)
    if wanted is not None and _COMMIT.fullmatch(wanted):
        # A commit needs no resolution: the resolve URL at a commit is content-addressed, so
        # the lock fetched at it proves the commit holds it (a commit the repo does not hold
        # is the endpoint's RevisionNotFound, a HubError naming it). A branch or tag names no
        # content and is resolved once, below.
        commit = wanted
    else:
        commit = _resolve(client, repo_id, repo_type, wanted or "main")
    # The GET asks for no more than the limit and one byte (an endpoint that sent more is
    # refused below).
    response = _request(client, repo_id, repo_type, commit, constants.LOCK_FILENAME,
                        {"Range": f"bytes=0-{MAX_LOCK_BYTES}"})
    named = response.headers.get("X-Repo-Commit")
    if named is not None and named != commit:
        raise HubError(f"{client.endpoint} answered {repo_id}@{commit} with commit {named}: "
                       "not the commit asked for; nothing was loaded. Check the endpoint.")
    data = response.content
    if len(data) > MAX_LOCK_BYTES:
        raise FormatError(f"cubepack.lock of {repo_id}@{commit} is {len(data)} bytes, above "
                          f"the {MAX_LOCK_BYTES}-byte limit.")
    lock = lockfile.parse(data)
    signed_by = None
    if trusted_keys is not None:
        signed_by = _signed_by(client, repo_id, repo_type, commit, data, lock,
                               list(trusted_keys))
        if lock.private:  # a replay: refused against the generations this client has seen
            seen = seen_check(lock, signed_by, list(trusted_keys),
                              where=f"in an open of {repo_id}@{commit}")
            if seen.ok is False:
                raise RefusedError(f"Refusing {repo_id}@{commit[:12]}: {seen.detail}. Nothing "
                                   "was fetched beyond its lock and signature.")
    return RemoteCube(repo_id, repo_type, commit, lock, client, signed_by, lock_bytes=data)


def _signed_by(client: HubClient, repo_id: str, repo_type: str, commit: str, data: bytes,
               lock: Lock, trusted_keys: list[str]) -> str:
    """The trusted key whose signature (fetched at ``commit``) covers the lock ``data``; a
    cube signed over its memories but not this lock is refused naming the re-signing."""
    signature = _request(client, repo_id, repo_type, commit, constants.SIGNATURE_FILENAME,
                         {}, missing_ok=True)
    attestation = None if signature is None else _request(
        client, repo_id, repo_type, commit, constants.ATTESTATION_FILENAME, {}, missing_ok=True)
    try:
        return verify_lock_signature(
            data, None if signature is None else signature.content,
            None if attestation is None else attestation.content, trusted_keys)
    except SignatureError as exc:
        if signature is None:  # one more request, on the way to a refusal only
            attestation = _request(client, repo_id, repo_type, commit,
                                   constants.ATTESTATION_FILENAME, {}, missing_ok=True)
        if attestation is not None and signs_another_lock(data, attestation.content):
            raise SignatureError(
                f"{repo_id}@{commit[:12]}: {constants.SIGNATURE_FILENAME} "
                f"{'is absent' if signature is None else 'does not cover this lock'}, and "
                "its attestation signs memories by digest but names another lock: the cube "
                "was re-laid out (cubepack compact) or changed since signing, which open "
                "cannot tell apart. Opening on demand checks "
                "a signature over the lock alone; one over the memories needs every shard "
                f"index ({len(lock.shards)} here), so it is not accepted here. Pull it whole "
                f"(cubepack pull {repo_id} --trusted-key PUB.pem: verify checks the "
                "memories' signature), or have its publisher sign the new layout: cubepack "
                "compact CUBE --sign-key KEY (or cubepack sign), then push.") from exc
        raise


def _resolve(client: HubClient, repo_id: str, repo_type: str, revision: str) -> str:
    """The commit ``revision`` (a branch or a tag) names now, by one HEAD of the lock; a lock
    above the limit by the size the HEAD states (an LFS file's X-Linked-Size: its redirect is
    not followed) is refused before a byte of it is fetched."""
    head = _request(client, repo_id, repo_type, revision, constants.LOCK_FILENAME, {},
                    head=True)
    commit = head.headers.get("X-Repo-Commit", "")
    if not _COMMIT.fullmatch(commit):
        raise HubError(f"{client.endpoint} named no commit (X-Repo-Commit) for {repo_id}@"
                       f"{revision}: it cannot be pinned to one; nothing was fetched.")
    stated = head.headers.get("X-Linked-Size") or head.headers.get("Content-Length") or ""
    if stated.isdigit() and int(stated) > MAX_LOCK_BYTES:
        raise FormatError(f"cubepack.lock of {repo_id}@{commit} is {int(stated)} bytes by its "
                          f"endpoint, above the {MAX_LOCK_BYTES}-byte limit; nothing was "
                          "fetched.")
    return commit


def _request(client: HubClient, repo_id: str, repo_type: str, revision: str, path: str,
             headers: dict[str, str], *, head: bool = False, missing_ok: bool = False) -> Any:
    """One request for ``path`` of ``repo_id`` at ``revision`` through huggingface_hub's own
    session (requests in 0.x, httpx in 1.x and 2.x), its errors turned into HubError
    (``missing_ok``: None for a file the commit does not hold)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, path, repo_type=repo_type, revision=revision,
                     endpoint=client.endpoint)
    sent = {**build_hf_headers(token=client.token), **headers}
    session = get_session()
    with client.translated(repo_id, repo_type, revision):
        method = session.head if head else session.get
        try:  # httpx follows no redirect unless asked; requests takes no such keyword
            response = client.run(method, url, headers=sent, follow_redirects=not head)
        except TypeError:
            response = client.run(method, url, headers=sent, allow_redirects=not head)
        if missing_ok and response.status_code == 404 \
                and response.headers.get("X-Error-Code") == "EntryNotFound":
            return None
        hf_raise_for_status(response)
    return response
