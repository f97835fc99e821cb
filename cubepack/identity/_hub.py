"""A Hub revision's identity from the Hub's metadata, downloading no weights.

:func:`fingerprint` of a Hub id downloads the model and hashes its weights. For a model that
runs elsewhere (a vLLM server) or for checking a pin against the Hub, the same identity is
computed from what the Hub states about that exact commit: the weights digest from the LFS
sha256 it reports per weight file (``files_metadata=True``), the stored dtype from each
safetensors header (two small byte-range reads per file, validated as strictly as a local
header), and every other field from the small files a fingerprint reads anyway
(:data:`~._fingerprint.FINGERPRINT_FILES`, downloaded through the HF cache) by
:func:`~._fingerprint.folder_identity`, the function a local folder goes through. The LFS
sha256 and the headers are the Hub's claims about bytes this process did not hash: a later
local fingerprint of the downloaded weights still decides whether they are those bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from .._util.canonical import loads_strict
from .._util.revision import is_commit
from .._util.safetensors_header import MAX_HEADER_BYTES, Header, parse_header
from ..errors import CubepackError, FormatError, HubError, ModelNotFoundError, UnsupportedError
from ._fingerprint import (
    digest_of_file_hashes,
    fingerprint_inputs,
    folder_identity,
    select_weight_names,
    stored_dtype,
)
from ._identity import ModelIdentity


def lfs_sha256(entry: Any) -> str | None:
    """The LFS sha256 the Hub reports for a file (a repo-info sibling or a tree entry), or None
    for a regular (non-LFS) file. Siblings carry it as ``lfs.sha256``, tree entries as
    ``lfs.oid``; both shapes and both client versions (dicts or objects) are handled here."""
    lfs = getattr(entry, "lfs", None)
    if lfs is None:
        return None
    if isinstance(lfs, dict):
        return lfs.get("sha256") or lfs.get("oid")
    return getattr(lfs, "sha256", None) or getattr(lfs, "oid", None)


def hub_weight_hashes(siblings: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """((name, LFS sha256) of each weight file, names of weight files without one) for a
    revision's file list (name -> sibling): the weights :func:`select_weight_names` picks for a
    folder, so the digest is the one a download would give."""
    entries, missing = [], []
    for name in select_weight_names(list(siblings)):
        sha256 = lfs_sha256(siblings[name])
        if sha256 is None:
            missing.append(name)
        else:
            entries.append((name, sha256))
    return entries, missing


def fingerprint_hub(repo_id: str, revision: str | None = None, *, endpoint: str | None = None,
                    token: str | bool | None = None, dtype: str | None = None) -> ModelIdentity:
    """The identity :func:`~cubepack.fingerprint` gives ``repo_id`` at ``revision`` (default
    ``main``, resolved to its 40-hex commit) once downloaded, computed without downloading
    its weights (see the module docstring).

    Raises:
        ModelNotFoundError: no such model or revision, or a revision without weight files.
        HubError: the endpoint cannot be reached or refused the request.
        UnsupportedError: a weight file the Hub reports no LFS sha256 for (its digest cannot
            be known without downloading it).
        FormatError: the revision's config.json or a safetensors header is malformed.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    if constants.hub_offline():
        raise HubError(f"Model {repo_id} cannot be pinned from the Hub's metadata offline "
                       "(HF_HUB_OFFLINE is set); pin it from the HF cache instead.")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except RevisionNotFoundError as exc:
        raise ModelNotFoundError(f"Model {repo_id} has no revision {revision!r}.") from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(f"Model {repo_id} was not found on the Hub (or needs a "
                                 "token).") from exc
    except Exception as exc:  # the client's HTTP and connection errors
        raise HubError(f"Cannot read the metadata of model {repo_id} at revision "
                       f"{revision or 'main'} from {api.endpoint}: {exc}") from exc
    return hub_identity(api, repo_id, info, dtype=dtype)


def hub_identity(api: Any, repo_id: str, info: Any, *, dtype: str | None = None) -> ModelIdentity:
    """The identity of the model revision ``info`` (``model_info(..., files_metadata=True)``
    at one commit) describes, through the HF client ``api`` (an ``HfApi``: endpoint and token).
    ``dtype``: the dtype it runs in, when known (then no header is read); else the stored one.

    Raises:
        ModelNotFoundError, UnsupportedError, FormatError, HubError: as :func:`fingerprint_hub`.
    """
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not is_commit(sha):
        raise HubError(f"{api.endpoint} gave no 40-hex commit for {repo_id} ({sha!r}).")
    siblings = {s.rfilename: s for s in info.siblings or []}
    entries, missing = hub_weight_hashes(siblings)
    if missing:
        raise UnsupportedError(
            f"The weight files {missing} of {repo_id}@{sha} have no LFS sha256 on the Hub, so "
            "their digest cannot be known without downloading them: download the model "
            f"(hf download {repo_id} --revision {sha}) and name its folder with --model.")
    if not entries:
        raise ModelNotFoundError(f"{repo_id}@{sha} holds no weight files (*.safetensors, "
                                 "*.bin, ...).")
    if constants.MODEL_CONFIG not in siblings:
        raise FormatError(f"{repo_id}@{sha} is not a model: it has no config.json.")
    folder = _download_inputs(api, repo_id, sha, fingerprint_inputs(list(siblings)))
    raw = (folder / constants.MODEL_CONFIG).read_bytes()
    try:  # the endpoint's files are read as strictly as a cube's
        config = loads_strict(raw)
    except ValueError as exc:
        raise FormatError(f"The config.json of {repo_id}@{sha} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise FormatError(f"The config.json of {repo_id}@{sha} must hold a JSON object.")
    if dtype is None:
        headers = [_remote_header(api, repo_id, sha, name, getattr(siblings[name], "size", None))
                   for name, _ in entries if name.endswith(".safetensors")]
        dtype = stored_dtype(headers, config)
    return folder_identity(folder, config, weights_digest=digest_of_file_hashes(entries),
                           dtype=dtype, model_id=repo_id, revision=sha)


def _download_inputs(api: Any, repo_id: str, sha: str, names: list[str]) -> Path:
    """The revision's snapshot folder in the HF cache, holding ``names`` (small files)."""
    from huggingface_hub import hf_hub_download

    folder = None
    for name in names:
        try:
            path = Path(hf_hub_download(repo_id, name, revision=sha, endpoint=api.endpoint,
                                        token=api.token))
        except Exception as exc:  # the client's HTTP and connection errors
            problem = atomic.cache_problem(exc) if isinstance(exc, OSError) else None
            if problem is not None:  # the HF cache cannot be written: the setting that moves it
                raise problem from exc
            raise HubError(f"Cannot download {name} of {repo_id}@{sha} from {api.endpoint}: "
                           f"{exc}") from exc
        folder = folder or path.parent
    assert folder is not None  # config.json is always among the names
    return folder


def _remote_header(api: Any, repo_id: str, sha: str, name: str, size: Any) -> Header:
    """The safetensors header of a file on the Hub, read by byte range (its length, then its
    JSON) and validated against the file size the Hub states."""
    where = f"{repo_id}@{sha}/{name}"
    if type(size) is not int or size < 8:
        raise FormatError(f"The Hub states no usable size for {where} ({size!r}).")
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo_id, name, revision=sha, endpoint=api.endpoint)
    prefix = _read_range(api, url, 0, 8, where)
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES or length > size - 8:
        raise FormatError(f"{where} declares a {length}-byte safetensors header, beyond the "
                          f"{MAX_HEADER_BYTES}-byte limit or the file's {size} bytes.")
    return parse_header(_read_range(api, url, 8, length, where), size, where)


def _read_range(api: Any, url: str, start: int, count: int, where: str) -> bytes:
    """``count`` bytes of ``url`` from byte ``start``: a ``Range`` request, read as a stream
    and cut off at ``count`` bytes (an endpoint that ignores the range is never read further
    than that). huggingface_hub's own session: requests (0.x) or httpx (1.x and later)."""
    from huggingface_hub import constants as hub_constants
    from huggingface_hub.utils import build_hf_headers, get_session

    headers = {**build_hf_headers(token=api.token), "Range": f"bytes={start}-{start + count - 1}"}
    session = get_session()
    timeout = hub_constants.HF_HUB_DOWNLOAD_TIMEOUT
    try:
        if callable(getattr(session, "stream", None)):  # httpx
            with session.stream("GET", url, headers=headers, follow_redirects=True,
                                timeout=timeout) as response:
                return _bounded(response, response.iter_bytes(), start, count, where)
        with session.get(url, headers=headers, stream=True, timeout=timeout) as response:
            return _bounded(response, response.iter_content(65536), start, count, where)
    except CubepackError:
        raise
    except Exception as exc:  # the HTTP library's errors
        raise HubError(f"Cannot read the safetensors header of {where}: {exc}") from exc


def _bounded(response: Any, chunks: Any, start: int, count: int, where: str) -> bytes:
    status = response.status_code
    if status not in (200, 206):
        raise HubError(f"The endpoint answered {status} to a byte-range read of {where}.")
    skip = start if status == 200 else 0  # the whole file: drop what precedes the range
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) >= skip + count:
            break
    if len(data) < skip + count:
        raise FormatError(f"{where} ended after {len(data)} bytes; its header needs "
                          f"{skip + count}.")
    return bytes(data[skip:skip + count])
