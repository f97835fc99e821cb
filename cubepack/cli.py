"""The ``cubepack`` command line: parse arguments, call the Python API, print the result.

Exit codes: 0 ok, 1 verification refused, 2 usage error, 3 any other error. Errors print one
line; ``--debug`` adds the traceback. Heavy libraries are imported inside each command so that
``cubepack --help`` stays instant and torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from .errors import CubepackError, PartialCube, Terminated, UsageError, VerificationFailed
from .format._provenance import LEVELS as PROVENANCE_LEVELS


class _Context:
    debug = False
    #: --json as click parsed it (None until parsed): ``--commit-message --json`` is a message.
    as_json: bool | None = None


def _note_json(_ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    _Context.as_json = _Context.as_json or value
    return value


def _json_option(help: str = "Print JSON.") -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help=help, callback=_note_json)


#: Exit status of a command stopped by Ctrl-C: the shell's 128 + SIGINT.
INTERRUPTED_EXIT = 130


#: CLI options that map onto :class:`cubepack.cube.TrustPolicy` fields, in one place.
_POLICY_OPTIONS = ("model", "trusted_keys", "require_signature", "require_lineage", "recompute",
                   "recompute_tokens", "seed", "require_provenance", "embedder",
                   "embedder_sample", "strict_models")


def _policy_options(*, without: tuple[str, ...] = ()
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The trust-policy options shared by verify, pull, sign and migrate (and --token, --json),
    but those ``without`` names (migrate's --model and --embedder name the new ones)."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for name, option in reversed(_POLICY_CLI):
            if name not in without:
                command = option(command)
        return command
    return decorate


_POLICY_CLI: list[tuple[str, Callable[..., Any]]] = [
    ("model", click.option("--model",
                           help="Check the pins against this model (folder or Hub id).")),
    ("recompute", click.option("--recompute", is_flag=True,
                               help="Prove each KV cache: the model's prefill must reproduce it.")),
    ("recompute_tokens", click.option(
        "--recompute-tokens", type=click.IntRange(min=1),
        help="Compare N positions of each cache, drawn at random (implies --recompute): a "
             "sample never proves 'recomputed'; N at least the cache's token count compares "
             "every position, a full check.")),
    ("seed", click.option("--seed", type=int,
                          help="Seed of the verifier's random draws (positions, probes, memories "
                               "re-embedded), to repeat a run; default: fresh, reported.")),
    ("require_provenance", click.option(
        "--require-provenance", type=click.Choice(PROVENANCE_LEVELS),
        help="Refuse activations whose producer label is backed by less.")),
    ("embedder", click.option("--embedder",
                              help="Check the text memory's vectors: a local model folder, "
                                   "openai:<base url>#<model> or ollama:<base url>#<model>.")),
    ("embedder_sample", click.option(
        "--embedder-sample", type=click.IntRange(min=0),
        help="Memories --embedder re-embeds, drawn at random (default 16; 0: all).")),
    ("trusted_keys", click.option(
        "--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False,
                                                                        exists=True),
        help="Public key (PEM) whose signature is accepted (repeatable); requires one.")),
    ("require_signature", click.option("--require-signature", is_flag=True,
                                       help="Refuse an unsigned cube.")),
    ("require_lineage", click.option(
        "--require-lineage", is_flag=True,
        help="Refuse a cube whose signed attestations do not chain up to a trusted key (its "
             "own, then each ancestor's to a root).")),
    ("strict_models", click.option(
        "--strict-models", is_flag=True,
        help="Refuse a pinned model no model was fingerprinted against (here, or by a trusted "
             "signer).")),
    ("token", click.option("--token",
                           help="Hub token (default: HF_TOKEN or the stored login).")),
    ("json", _json_option()),
]


def _timeout_option(action: str) -> Callable[..., Any]:
    return click.option("--timeout", type=float, default=None, metavar="SECONDS",
                        help=f"Seconds the whole {action} may take talking to the endpoint "
                             "(default: CUBEPACK_HUB_TIMEOUT, else 3600).")


def _policy(options: dict[str, Any]) -> Any:
    """Take the policy options out of a command's ``options`` and build the policy."""
    from .trust._policy import TrustPolicy

    return TrustPolicy(**{name: options.pop(name) for name in _POLICY_OPTIONS if name in options})


def _emit_error(exc: CubepackError) -> None:
    report = getattr(exc, "report", None)
    error = {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}
    details = getattr(exc, "details", None)
    if details:  # what a script may read besides the message (a stall's request and rate)
        error["details"] = details
    click.echo(json.dumps({"ok": False, "error": error,
                           "report": report.to_dict() if report is not None else None},
                          indent=2, sort_keys=True, default=str))


def _emit(data: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    """One result on stdout: text, or one JSON object that always carries ``ok``."""
    if as_json:
        click.echo(json.dumps({"ok": True, **data}, indent=2, sort_keys=True, default=str))
    else:
        click.echo(render(data))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.option("--verbose", is_flag=True,
              help="Show the warnings and log lines of the libraries cubepack calls "
                   "(also CUBEPACK_VERBOSE=1).")
@click.version_option(package_name="cubepack")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """cubepack: pin, lock, verify and share LLM memory cubes and KV caches.

    Exit codes: 0 ok, 1 verification refused, 2 usage error, 3 other error, 4 a partial
    cube (pulled with --include): verified as far as it goes, or refused by a verb.
    """
    _Context.debug = debug
    from ._util.quiet import quiet_libraries

    # Progress bars only on a terminal; third-party warnings only with --verbose. Set before
    # the command imports anything heavy (the libraries read the environment at import).
    ctx.with_resource(quiet_libraries(verbose or None))


@cli.command("fingerprint")
@click.argument("model")
@click.option("--revision", help="Branch, tag or commit, for a Hub model id.")
@click.option("--dtype", help="The dtype the model runs in, when not its stored dtype.")
@_json_option()
def fingerprint_command(model: str, revision: str | None, dtype: str | None, as_json: bool) -> None:
    """Print the identity of MODEL (a local folder or a Hub model id)."""
    from .identity._fingerprint import fingerprint

    identity = fingerprint(model, revision=revision, dtype=dtype)
    _emit(identity.to_dict(), as_json, _render_identity)


def _render_identity(data: dict[str, Any]) -> str:
    geometry = data["geometry"]
    lines = [
        f"model id:         {data['model_id'] or '(local folder)'}",
        f"revision:         {data['revision'] or '(none: not from the Hub cache)'}",
        f"weights_digest:   {data['weights_digest']}",
        f"tokenizer_digest: {data['tokenizer_digest']}",
        f"dtype / kv_dtype: {data['dtype']} / {data['kv_dtype']}",
        f"quantization:     {data['quantization']}",
        f"adapters:         {data['adapters']}",
        "geometry:         " + ", ".join(
            f"{k}={v}" for k, v in geometry.items() if k != "layer_types"),
        f"layer types:      {', '.join(geometry.get('layer_types') or [])}",
    ]
    return "\n".join(lines)


@cli.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@_json_option()
def inspect_command(file: str, as_json: bool) -> None:
    """Show a KV file's format version, producer, shapes and token count."""
    from .kv._format import read_kv_header

    info = read_kv_header(file).to_dict()
    _emit(info, as_json, _render_kv)


def _render_kv(data: dict[str, Any]) -> str:
    producer = data["producer"]
    first = data["layers"][0]["shape"] if data["layers"] else []
    lines = [
        f"file:        {data['path']}",
        f"format:      {data['format']} v{data['version']}",
        f"tokens:      {data['token_count']}",
        f"layers:      {data['num_layers']} ({data['kv_dtype']}, layer 0 shape {first})",
        "checksums:   " + (f"{data['checksums']['algorithm']}, "
                           f"{len(data['checksums']['tensors'])} tensors"
                           if data.get("checksums") else f"none (format v{data['version']})"),
        f"producer:    {producer['model_id'] or '(local model)'}"
        + (f"@{producer['revision']}" if producer.get("revision") else ""),
        f"  weights:   {producer['weights_digest']}",
        f"  tokenizer: {producer['tokenizer_digest']}",
        f"  dtype:     {producer['dtype']}",
    ]
    if data["metadata"]:
        lines.append(f"metadata:    {json.dumps(data['metadata'], sort_keys=True)[:200]}")
    return "\n".join(lines)


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10,
               "mib": 2**20, "gib": 2**30}


def _byte_size(text: str) -> int:
    """A size as a flag gives it: ``1000``, ``64MiB``, ``2GB``."""
    import re

    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS or int(match.group(1)) < 1:
        raise click.BadParameter(f"{text!r} is no size: give a positive number of bytes, or "
                                 "one with KB, MB, GB, KiB, MiB or GiB (e.g. 512MiB).")
    return int(match.group(1)) * _SIZE_UNITS[unit]


@cli.command("pack")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--model", help="Producer model (folder or Hub id); overrides config.json's act_mem LLM.")
@click.option("--revision", help="Branch, tag or commit of a Hub --model to pin.")
@click.option("--legacy-pickle", is_flag=True,
              help="Convert MemOS activation pickles to KV files (allowlist unpickler).")
@click.option("--license", "license_", help="License for the card's metadata (e.g. apache-2.0).")
@click.option("--pretty-name", help="Title of the model card.")
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True),
              help="ECDSA P-256/P-384 private key (PEM): also sign the packed cube.")
@click.option("--assert-producer", is_flag=True,
              help="Label converted caches as --model's although config.json names another "
                   "producer (recorded in the lock and card as asserted).")
@click.option("--recompute", is_flag=True,
              help="Prove every activation with the producer model (recorded as recomputed).")
@click.option("--embedder", help="The embedder that made the text memory's vectors (checked; "
                                 "its probe vectors are recorded).")
@click.option("--cube-id", help="The cube's id, for a folder without MemOS's config.json.")
@click.option("--adapter-base", help="Base model of the cube's LoRA adapters (folder or Hub id"
                                     "[@revision]); default: the recorded pin, else the name "
                                     "adapter_config.json claims.")
@click.option("--encrypt-to", "encrypt_to", multiple=True, metavar="RECIPIENT",
              help="Then encrypt every file to RECIPIENT (age1..., an SSH public key, or a file "
                   "of them; repeatable): a private cube.")
@click.option("--hide-names", is_flag=True,
              help="With --encrypt-to: name ciphertexts private/<random>.age (no item ids).")
@click.option("--shards/--no-shards", "shards", default=None,
              help="Store the activation memories many to a file (shards, each with its "
                   "index), or one a file; default: shards above 100 memories, or when the "
                   "cube is sharded already.")
@click.option("--shard-size", metavar="SIZE", callback=lambda ctx, param, value:
              None if value is None else _byte_size(value),
              help="A shard's bound (bytes, or with KB/MB/GB/KiB/MiB/GiB; implies --shards; "
                   "default: the bound the cube was packed with, else 2GiB; kept in "
                   "cubepack.yaml). A memory larger than it gets a shard of its own.")
@click.option("--remove", "remove", multiple=True, metavar="ITEM",
              help="Drop the sharded memory ITEM (repeatable); with a new "
                   "activations/ITEM.kv.safetensors, replace it. Its bytes stay in its shard, "
                   "dead, until cubepack compact.")
@_json_option()
def pack_command(cube_dir: str, model: str | None, revision: str | None, legacy_pickle: bool,
                 license_: str | None, pretty_name: str | None, sign_key: str | None,
                 assert_producer: bool, recompute: bool, embedder: str | None,
                 cube_id: str | None, adapter_base: str | None, encrypt_to: tuple[str, ...],
                 hide_names: bool, shards: bool | None, shard_size: int | None,
                 remove: tuple[str, ...], as_json: bool) -> None:
    """Pin, lock and card the cube in CUBE_DIR, in place and atomically."""
    from .ops import pack

    if hide_names and not encrypt_to:
        raise UsageError("--hide-names hides a private cube's file names: pass --encrypt-to.")
    if encrypt_to:  # fail on a bad recipient before any work
        from .trust._age import parse_recipients

        parse_recipients(list(encrypt_to))
    result = pack(cube_dir, model=model, revision=revision, legacy_pickle=legacy_pickle,
                  license=license_, pretty_name=pretty_name,
                  sign_key=None if encrypt_to else sign_key,
                  sign_password=_key_password(), assert_producer=assert_producer,
                  recompute=recompute, embedder=embedder, cube_id=cube_id,
                  adapter_base=adapter_base, shards=shards, shard_size=shard_size,
                  remove=tuple(remove))
    data = result.to_dict()
    if encrypt_to:
        from ._util import constants
        from .ops import encrypt

        private = encrypt(cube_dir, list(encrypt_to), hide_names=hide_names, sign_key=sign_key,
                          sign_password=_key_password())
        # The clear pack's item ids and plaintext digests (the clear lock's content digest,
        # the adapters' weight digests) stay out of the output of a private pack: a digest of
        # plaintext confirms a guessed cube. What is printed is the public lock's.
        public = json.loads((Path(cube_dir) / constants.LOCK_FILENAME).read_text())
        data = {**data, "activations": [], "converted": [], "recomputed": {}, "unchecksummed": {},
                "digest": private.digest, "content_digest": public.get("content_digest"),
                "adapters": {name: {k: v for k, v in adapter.items() if k != "digest"}
                             for name, adapter in data["adapters"].items()},
                "private": private.to_dict()}
    _emit(data, as_json, _render_pack)


def _render_pack(data: dict[str, Any]) -> str:
    lines = [f"packed {data['cube_dir']}" + ("" if data["changed"] else " (unchanged)"),
             f"  files:       {data['files']} (listed in the lock, the lock itself aside)",
             f"  activations: {len(data['activations'])}"
             + (f" ({len(data['converted'])} converted from the MemOS pickle)" if data["converted"] else "")]
    for role, shown in data["models"].items():  # pack's JSON output, not a lock
        if shown["revision"]:
            where = f"{shown['repo_id']}@{shown['revision']}"
        elif shown.get("pinned"):
            where = f"{shown['name']} (a local folder: pinned by weights digest, no Hub revision)"
        else:
            where = (f"{shown['name'] or '(no model named)'}: not pinned "
                     f"({shown.get('reason') or 'unavailable'})")
        was = data.get("moved_from", {}).get(role)
        lines.append(f"  model {role}: {where}" + (f" (moved: was {was})" if was else ""))
    for item, proof in sorted(data.get("recomputed", {}).items()):
        lines.append(f"  proved {item}: {proof}")
    for item, note in sorted(data.get("unchecksummed", {}).items()):
        lines.append(f"  unchecked {item}: {note}")
    for name, adapter in sorted(data.get("adapters", {}).items()):
        claim = f"; its config claims {adapter['claimed_base']}" if adapter["claimed_base"] else ""
        lines.append(f"  adapter {name}: {adapter.get('digest', 'encrypted')}, base pinned as model "
                     f"{adapter['model_role']} (found by {adapter['base_source']}{claim})")
    lines.append(f"  lock digest: {data['digest']}")
    if data.get("private"):
        lines.append(_render_private(data["private"]))
    return "\n".join(lines)


def _render_private(data: dict[str, Any]) -> str:
    lines = [f"private: {data['ciphertexts']} files encrypted to "
             f"{len(data['recipients'])} recipient(s)"
             + (" (names hidden)" if data["hidden_names"] else "")
             + (f", generation {data['generation']}" if data.get("generation") else "")]
    lines += [f"  recipient: {r}" for r in data["recipients"]]
    lines += [f"  added:     {r}" for r in data.get("added", [])]
    lines += [f"  removed:   {r} (what they downloaded before stays readable to them)"
              for r in data.get("removed", [])]
    lines += [f"  RE-ADDED:  {entry['recipient']}: removed "
              + (f"at generation {entry['removed_at']}" if entry["removed_at"] is not None
                 else "by a newer generation you have seen")
              + ", now a reader again" for entry in data.get("readded", [])]
    if data.get("unrecorded"):
        lines.append(f"  generation{data['unrecorded']}")
    lines.append(f"  signed with {data['signed_with']}" if data["signed_with"] else
                 "  unsigned: anyone who can push can replace an unsigned private cube (age "
                 "does not authenticate senders); sign it: cubepack sign CUBE --key "
                 "SIGNING_KEY (it records the generation it signs)")
    return "\n".join(lines)


def _identity_option() -> Callable[..., Any]:
    def undumpable(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value:  # this process will hold plaintext: no core dump may write it to a disk
            from ._util.ramdir import no_core_dumps

            no_core_dumps()
        return value

    return click.option("--identity", type=click.Path(dir_okay=False), envvar="CUBEPACK_IDENTITY",
                        callback=undumpable,
                        help="Identity file opening a private cube (age key or OpenSSH private "
                             "key; mode 600), decrypted in memory only (also CUBEPACK_IDENTITY); "
                             "a protected key's passphrase is asked on the terminal (or "
                             "CUBEPACK_IDENTITY_PASSPHRASE); the command then writes no core "
                             "dump.")


def _resign_trust_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    # The policy's trusted_keys, as encrypt and rekey honour them (TrustPolicy HONOURED).
    return click.option(
        "--trusted-key", "trusted_keys", multiple=True,
        type=click.Path(dir_okay=False, exists=True),
        help="Public key (PEM) the cube must be signed by (repeatable); with --sign-key, the "
             "signing key's own public half counts as one.")


@cli.command("encrypt")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--to", "recipients", multiple=True, required=True, metavar="RECIPIENT",
              help="age1..., an SSH public key (ssh-ed25519/ssh-rsa), or a file of them "
                   "(repeatable).")
@click.option("--hide-names", is_flag=True, help="Name ciphertexts private/<random>.age.")
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True),
              help="ECDSA P-256/P-384 private key (PEM): sign the private cube.")
@click.option("--continue", "continue_from", type=click.Path(file_okay=False, exists=True),
              metavar="PRIVATE_DIR",
              help="The private cube this one replaces (a pull of it): continue its series, a "
                   "generation above it, so readers refuse the revisions it replaces.")
@_resign_trust_option()
@_json_option()
def encrypt_command(cube_dir: str, recipients: tuple[str, ...], hide_names: bool,
                    sign_key: str | None, continue_from: str | None,
                    trusted_keys: tuple[str, ...], as_json: bool) -> None:
    """Verify the packed cube in CUBE_DIR, then encrypt every file to the recipients (age),
    in place and atomically."""
    from .ops import encrypt

    result = encrypt(cube_dir, list(recipients), hide_names=hide_names, sign_key=sign_key,
                     sign_password=_key_password(), trusted_keys=list(trusted_keys),
                     continue_from=continue_from)
    _emit(result.to_dict(), as_json, _render_private)


@cli.command("rekey")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--add", multiple=True, metavar="RECIPIENT", help="Recipient to add (repeatable).")
@click.option("--remove", multiple=True, metavar="RECIPIENT",
              help="Recipient to remove (repeatable); it keeps what it already downloaded.")
@click.option("--to", "to", multiple=True, metavar="RECIPIENT",
              help="Every recipient of the rekeyed cube, named (repeatable; not with --add or "
                   "--remove): the only way to rekey a cube no trusted key signed.")
@click.option("--rotate", is_flag=True,
              help="New file keys for every file (every rekey draws them; alone, or when the "
                   "recipients stay the same, it is what asks for them).")
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True),
              help="Sign the rekeyed cube (else it is left unsigned, and said so).")
@_resign_trust_option()
@_identity_option()
@_json_option()
def rekey_command(cube_dir: str, add: tuple[str, ...], remove: tuple[str, ...],
                  to: tuple[str, ...], rotate: bool, sign_key: str | None,
                  trusted_keys: tuple[str, ...], identity: str | None, as_json: bool) -> None:
    """Change the recipients of the private cube in CUBE_DIR (needs an identity), as its next
    generation; a revision older than one you have seen is refused."""
    from .ops import rekey

    if identity is None:
        raise UsageError("rekey decrypts the cube in memory: pass --identity KEY (or set "
                         "CUBEPACK_IDENTITY).")
    result = rekey(cube_dir, identity, add=list(add), remove=list(remove), to=list(to),
                   rotate=rotate,
                   sign_key=sign_key, sign_password=_key_password(),
                   trusted_keys=list(trusted_keys))
    _emit(result.to_dict(), as_json, _render_private)


@cli.command("verify")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--remote", is_flag=True,
              help="Also check pinned models against the Hub's file metadata (no weight download).")
@_identity_option()
@_policy_options()
def verify_command(cube_dir: str, remote: bool, identity: str | None, token: str | None,
                   as_json: bool, **options: Any) -> None:
    """Verify CUBE_DIR against its lock: files, hashes, KV headers, pins. Exit 1 on refusal."""
    policy = _policy(options)
    if remote:
        from .hub._remote import verify_remote

        report = verify_remote(cube_dir, policy, token=token, raise_on_failure=False,
                               decrypt_with=identity)
    else:
        from .ops import verify

        report = verify(cube_dir, policy, raise_on_failure=False, decrypt_with=identity)
    if not report.ok:
        raise VerificationFailed(report)  # main() prints the report and the error
    if report.partial is not None:  # never reported as a complete cube: its own exit code
        raise PartialCube(_partial_line(report.partial), report)
    _emit(report.to_dict(), as_json, _render_report)


def _partial_line(partial: dict[str, Any]) -> str:
    return (f"{partial['checked']} of {partial['memories']} memories checked: a partial pull "
            f"of {partial['repo_id']}@{partial['commit_sha'][:12]}, not the whole cube (pull "
            "it whole to check the others)")


#: A private cube's report in two parts, so a check on ciphertexts never reads as one on
#: the plaintext (or the reverse).
_SCOPES = {"public": "-- public: what anyone can check (ciphertexts, public lock, signature) --",
           "decrypted": "-- decrypted in memory: checks of the plaintext --"}


def _render_report(data: dict[str, Any]) -> str:
    marks = {True: "ok  ", False: "FAIL", None: "skip"}
    lines = []
    scope = None
    for check in data["checks"]:
        if check.get("scope") != scope and check.get("scope") in _SCOPES:
            scope = check["scope"]
            lines.append(_SCOPES[scope])
        basis = f"[{check['basis']}]" if check.get("basis") else ""
        line = (f"{marks[check['ok']]} {check['check']:<15} {basis:<9} {check['subject']}: "
                f"{check['detail']}")
        if check["ok"] is not True and (check["expected"] is not None
                                        or check["found"] is not None):
            line += f"\n     expected {check['expected']}\n     found    {check['found']}"
        lines.append(line)
    for item, backing in sorted((data.get("provenance") or {}).items()):
        lines.append(f"provenance {item}: {backing['kind']} [{backing['basis']}] "
                     f"{backing['detail']}")
    if data["ok"] and data.get("partial"):
        lines.append("PARTIAL: " + _partial_line(data["partial"]) + "; every byte present is "
                     "the one the lock records")
    elif data["ok"]:
        lines.append("verified: every file is the one the lock records; " + (
            f"the lock is signed by trusted key {data['signed_by']}" if data.get("signed_by")
            else "the lock and what it says are the cube author's claims (no trusted "
                 "signature: --trusted-key)")
            + (f"; attested by trusted key {data['attested_by']}" if data.get("attested_by")
               else ""))
    else:
        lines.append("REFUSED: do not load this cube")
    return "\n".join(lines)


@cli.group("import")
def import_group() -> None:
    """Convert another runtime's KV cache into a cubepack KV file."""


def _token_ids(value: str | None) -> list[int] | None:
    """``--token-ids``: a JSON list of integers, or @FILE holding one."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--token-ids {value}: {getattr(exc, 'strerror', None) or exc}") \
                from exc
    from ._util import canonical

    try:  # strict: a 5000-digit id is refused by cubepack's limit, not Python's int advice
        ids = canonical.loads_strict(text)
    except ValueError as exc:
        raise UsageError(f"--token-ids must be a JSON list of integers: {exc}") from exc
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise UsageError("--token-ids must be a JSON list of integers, e.g. [1, 17, 42].")
    return ids


@import_group.command("mlx")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--model", required=True,
              help="The model folder (or Hub id) MLX loaded: its fingerprint is the producer.")
@click.option("--revision", help="Branch, tag or commit of a Hub --model.")
@click.option("--out", type=click.Path(dir_okay=False),
              help="The KV file to write (default: FILE's stem + .kv.safetensors).")
@click.option("--token-ids", help="The ids the cache covers: a JSON list, or @FILE (mlx_lm "
                                  "records none; without them no other runtime accepts it).")
@click.option("--recompute", is_flag=True,
              help="Prove it first: MLX runs --model on the token ids and must reproduce it.")
@_json_option()
def import_mlx_command(file: str, model: str, revision: str | None, out: str | None,
                       token_ids: str | None, recompute: bool, as_json: bool) -> None:
    """Convert an MLX-LM prompt cache FILE into a KV file pinned to MODEL."""
    from .kv._format import read_kv_header
    from .mlx import import_prompt_cache

    path = import_prompt_cache(file, model, out=out, token_ids=_token_ids(token_ids),
                               revision=revision, recompute=recompute)
    info = read_kv_header(path)
    _emit({"path": str(path), "token_count": info.token_count, "kv_dtype": info.kv_dtype,
           "runtime": info.metadata.get("runtime"), "recomputed": recompute,
           "producer": info.producer.to_dict()}, as_json,
          lambda d: f"imported {d['token_count']} positions ({d['kv_dtype']}, {d['runtime']}) "
                    f"to {d['path']}" + (" (recomputed by MLX)" if d["recomputed"] else ""))


@cli.group("export")
def export_group() -> None:
    """Write a cubepack KV file in another runtime's cache format."""


def _item_option() -> Any:
    return click.option("--item", help="KVFILE is a cube folder: export its memory ITEM (a "
                                       "shard's range or its own file, checked first).")


def _export_source(kvfile: str, item: str | None) -> None:
    """A folder needs --item (which memory), a file takes none: refused before any work."""
    if Path(kvfile).is_dir() and item is None:
        raise UsageError(f"{kvfile} is a folder: name the memory to export with --item ID "
                         "(cubepack inspect lists them).")
    if not Path(kvfile).is_dir() and item is not None:
        raise UsageError(f"--item names a memory of a cube folder; {kvfile} is a file.")


@export_group.command("mlx")
@click.argument("kvfile", type=click.Path(exists=True))
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="The MLX-LM prompt cache to write (mlx_lm's load_prompt_cache reads it).")
@click.option("--model", help="Refuse unless the KV file's producer is this model.")
@_item_option()
@_json_option()
def export_mlx_command(kvfile: str, out: str, model: str | None, item: str | None,
                       as_json: bool) -> None:
    """Write KVFILE (or a cube's memory --item) as an MLX-LM prompt cache that carries its
    producer."""
    _export_source(kvfile, item)
    from .mlx import export_prompt_cache

    path = export_prompt_cache(kvfile, out, model=model, item=item)
    _emit({"path": str(path)}, as_json, lambda d: f"exported to {d['path']}")


@cli.command("upgrade")
@click.argument("path", type=click.Path(exists=True))
@click.option("--model", required=True, help="The producer model (folder or Hub id).")
@click.option("--revision", help="Branch, tag or commit of a Hub --model.")
@click.option("--shards/--no-shards", "shards", default=None,
              help="A cube: store its activation memories many to a file (converts a cube of "
                   "one file a memory), or one a file; default: as pack decides.")
@click.option("--shard-size", metavar="SIZE", callback=lambda ctx, param, value:
              None if value is None else _byte_size(value),
              help="A shard's bound, as for pack (implies --shards).")
@_json_option()
def upgrade_command(path: str, model: str, revision: str | None, shards: bool | None,
                    shard_size: int | None, as_json: bool) -> None:
    """Upgrade a KV file or a cube from an older format, checked against its producer MODEL."""
    from .ops import upgrade

    result = upgrade(path, model, revision=revision, shards=shards, shard_size=shard_size)
    _emit(result.to_dict(), as_json,
          lambda d: f"upgraded {len(d['upgraded'])} file(s), {len(d['current'])} already current: "
                    f"{d['path']}" + (f"\n  unsigned: {', '.join(d['unsigned'])} signed the lock "
                                      f"it replaced and were removed; sign it again: "
                                      f"{d['sign_again']}" if d["unsigned"] else ""))


@cli.command("compact")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--above", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Rewrite each shard whose dead share (bytes of removed or replaced memories "
                   "/ its size) is above this; shards whose id ranges overlap are rewritten "
                   "too.")
@click.option("--shard-size", metavar="SIZE", callback=lambda ctx, param, value:
              None if value is None else _byte_size(value),
              help="A shard's bound, as for pack; shards past it are rewritten too. Default: "
                   "the bound the cube was packed with (else 2GiB).")
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True),
              help="ECDSA P-256/P-384 private key (PEM): sign the compacted cube.")
@_json_option()
def compact_command(cube_dir: str, above: float, shard_size: int | None, sign_key: str | None,
                    as_json: bool) -> None:
    """Rewrite the shards of CUBE_DIR whose dead share passes --above, in place and
    atomically (the other shards stay byte for byte)."""
    from .ops import compact

    result = compact(cube_dir, above=above, shard_size=shard_size, sign_key=sign_key,
                     sign_password=_key_password())
    _emit(result.to_dict(), as_json, lambda d: (
        f"compacted {d['cube_dir']}: rewrote {len(d['removed'])} shard(s) into "
        f"{len(d['written'])}; dead bytes {d['dead_before']} -> {d['dead_after']}; lock "
        f"version {d['lock_version']}" + (
            "; its signature covers its memories, not this layout: cubepack.open with "
            f"trusted keys needs cubepack compact {d['cube_dir']} --sign-key KEY"
            if d["signature"] == "memories" else "") if d["changed"] else
        f"nothing to compact in {d['cube_dir']} (no shard's dead share above {d['bound']:g}, "
        "no overlapping ranges)"))


@cli.command("sign")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--key", required=True, type=click.Path(dir_okay=False, exists=True),
              help="ECDSA P-256/P-384 private key (PEM). Password: CUBEPACK_KEY_PASSWORD.")
@_policy_options(without=("token",))
def sign_command(cube_dir: str, key: str, as_json: bool, **options: Any) -> None:
    """Verify CUBE_DIR, then sign it (writes cubepack.intoto.json, an in-toto attestation of
    its lock, then cubepack.sig, OpenSSF model-signing format).

    The attestation states as proved only what this verification proved (pins of the model
    given with --model, caches it recomputed with --recompute); the rest of the lock is signed
    as the claim it is."""
    from ._util.constants import ATTESTATION_FILENAME
    from .ops import sign

    path = sign(cube_dir, key, _policy(options), password=_key_password())
    _emit({"signature": str(path), "attestation": str(path.with_name(ATTESTATION_FILENAME))},
          as_json, lambda d: f"signed: {d['signature']}\nattested: {d['attestation']}")


def _key_password() -> str | None:
    import os

    return os.environ.get("CUBEPACK_KEY_PASSWORD") or None


@cli.command("diff")
@click.argument("a", type=click.Path(exists=True))
@click.argument("b", type=click.Path(exists=True))
@_json_option()
def diff_command(a: str, b: str, as_json: bool) -> None:
    """Show what changed from cube (or lock) A to B."""
    from .ops import diff

    _emit(diff(a, b), as_json, _render_diff)


def _render_diff(data: dict[str, Any]) -> str:
    if data["same"]:
        return "identical locks"
    lines = []
    for key, section in data["sections"].items():
        basis = section.get("basis", {})
        for kind in ("added", "removed"):
            lines += [f"{kind}: {section['describe'][name]}" for name in section[kind]]
        for name, changes in section["changed"].items():
            note = f" [{basis[name]}: the lock's word]" if name in basis else ""
            lines.append(f"changed: {section['describe'][name]}{note}")
            lines += [f"  {change['field']}: {change['old']} -> {change['new']}"
                      for change in changes]
    lines += [f"lock {change['field']}: {change['old']} -> {change['new']}"
              for change in data["lock"]]
    memories = data.get("memories") or {}
    for kind in ("added", "removed"):
        lines += [f"memory {kind}: {name}" for name in memories.get(kind, [])]
    for name, changes in memories.get("changed", {}).items():
        lines.append(f"memory changed: {name}")
        lines += [f"  {change['field']}: {change['old']} -> {change['new']}"
                  for change in changes]
    if data["content_digest"]["old"] == data["content_digest"]["new"]:
        lines.append("content digest unchanged (only the card or lock fields differ)")
    return "\n".join(lines)


@cli.command("migrate")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--model", help="The new producer model (folder or Hub id): every activation is "
                              "re-prefilled by it.")
@click.option("--revision", help="Branch, tag or commit of a Hub --model to pin.")
@click.option("--embedder", help="The new embedder (a local model folder, "
                                 "openai:<base url>#<model> or ollama:<base url>#<model>): every "
                                 "text memory is re-embedded by it.")
@click.option("--out", required=True, type=click.Path(),
              help="Where the new cube goes: a new path or an empty folder.")
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True),
              help="ECDSA P-256/P-384 private key (PEM): sign the new cube, its lineage stated "
                   "as derived by this migrate.")
@_policy_options(without=("model", "embedder", "embedder_sample", "recompute",
                          "recompute_tokens", "seed", "token"))
def migrate_command(cube_dir: str, model: str | None, revision: str | None,
                    embedder: str | None, out: str, sign_key: str | None, as_json: bool,
                    **options: Any) -> None:
    """Build a new packed cube at --out for a new --model and/or --embedder from CUBE_DIR
    (verified first under the trust options given, left untouched), recording its lineage."""
    if model is None and embedder is None:  # before any import: a usage error does no work
        raise UsageError("migrate needs a new model, a new embedder or both: pass --model M "
                         "and/or --embedder E.")
    from .ops import migrate

    result = migrate(cube_dir, _policy(options), out=out, model=model, revision=revision,
                     embedder=embedder, sign_key=sign_key, sign_password=_key_password())
    _emit(result.to_dict(), as_json, _render_migrate)


def _render_migrate(data: dict[str, Any]) -> str:
    changes = data["lineage"]["changes"]
    lines = [f"migrated {data['parent_dir']} -> {data['cube_dir']}"]
    for role, change in changes["models"].items():
        lines.append(f"  model {role}: {change['from']} -> {change['to']}")
    for item, entry in sorted(data["activations"].items()):
        how = (f"re-tokenised from its source_text ({entry['retokenized']})"
               if entry["retokenized"] else "from its stored token ids")
        lines.append(f"  re-prefilled {item}: {entry['tokens']} tokens, {how}")
    if "embedder" in changes:
        lines.append(f"  embedder: {changes['embedder']['from']} -> {changes['embedder']['to']}; "
                     f"re-embedded {data['reembedded']} text memories")
    for name, files in sorted(data["adapters_dropped"].items()):
        lines.append(f"  adapter {name}: NOT migrated (an adapter is valid only for its base "
                     f"model; left out: {', '.join(files) or 'no files'}); retrain it for the "
                     "new model")
    lines.append(f"  lock digest: {data['digest']} (parent "
                 f"{data['lineage']['parent']['lock_digest']})")
    return "\n".join(lines)


@cli.command("lineage")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--follow", is_flag=True,
              help="Fetch each parent's lock through the Hub (at the commit recorded) up to "
                   "the root, checking each link's digest.")
@click.option("--repo-type", type=click.Choice(["dataset", "model"]), default="dataset",
              show_default=True, help="The repo type of the parents (with --follow).")
@click.option("--token", help="Hub token (default: HF_TOKEN or the stored login).")
@_timeout_option("--follow")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def lineage_command(cube_dir: str, follow: bool, repo_type: str, token: str | None,
                    timeout: float | None, as_json: bool) -> None:
    """Show the chain CUBE_DIR was derived from: its parent and what changed, and with --follow
    every ancestor up to the root."""
    from .hub._lineage import lineage

    result = lineage(cube_dir, follow=follow, repo_type=repo_type, token=token, timeout=timeout)
    _emit(result.to_dict(), as_json, _render_lineage)


def _ref_words(link: dict[str, Any]) -> str:
    """Where a fetched parent's commit sits in its repo, for ``lineage --follow``'s text."""
    from .hub._lineage import BRANCH, PULL_REQUEST, TAG

    ref = link.get("ref") or {}
    return {BRANCH: f"on branch {ref.get('name')}",
            TAG: f"tagged {ref.get('name')}, on no branch",
            PULL_REQUEST: f"a pull request's commit: {ref.get('name')}, which anyone may open "
                          "on the repo; on no branch"}.get(
        ref.get("kind"), f"on no branch, tag or pull request of {link['repo_id']}")


def _render_lineage(data: dict[str, Any]) -> str:
    from .trust._evidence import PROVED

    lines = []
    for index, link in enumerate(data["chain"]):
        where = data["cube_dir"] if index == 0 else f"{link['repo_id']}@{link['revision']}"
        lines.append(("cube " if index == 0 else "parent ") + where
                     + ("" if index == 0 else f" ({_ref_words(link)}; its lock's digest is the "
                                              "one recorded)"))
        lines.append(f"  lock digest: {link['lock_digest']}")
        if link["root"]:
            lines.append("  root: records no parent")
            continue
        parent, changes = link["parent"], link["changes"]
        at = f"{parent['repo_id']}@{parent['revision']}" if parent["repo_id"] else \
            "not pulled from a Hub"
        basis = ("proved: fetched at that commit, its digests match"
                 if link.get("parent_basis") == PROVED else
                 "claimed: the lock says so; --follow checks it")
        lines.append(f"  parent: lock {parent['lock_digest']} ({at}) [{basis}]")
        for role, change in changes["models"].items():
            lines.append(f"  changed {role}: {change['from']} -> {change['to']} (weights "
                         f"{change['from_weights']} -> {change['to_weights']})")
        if "embedder" in changes:
            lines.append(f"  changed embedder: {changes['embedder']['from']} -> "
                         f"{changes['embedder']['to']} ({changes['reembedded']} re-embedded)")
        if changes["retokenized"]:
            lines.append(f"  re-tokenised: {', '.join(changes['retokenized'])}")
        if changes["adapters_dropped"]:
            lines.append(f"  adapters not migrated: {', '.join(changes['adapters_dropped'])}")
    if data["stopped"]:
        lines.append(f"chain incomplete: {data['stopped']}")
    elif data["followed"]:
        lines.append("chain complete: every parent fetched, every link's digest matches")
    elif not data["complete"]:
        lines.append("(--follow fetches the parents through the Hub)")
    return "\n".join(lines)


@cli.command("push")
@click.argument("cube_dir", type=click.Path(file_okay=False, exists=True))
@click.argument("repo_id")
@click.option("--repo-type", type=click.Choice(["dataset", "model"]), default="dataset",
              show_default=True, help="MemOS expects dataset repos.")
@click.option("--private", is_flag=True, help="Create the repo private (if it does not exist).")
@click.option("--revision", help="Branch to push to (created from main if missing), or "
                                 "refs/pr/N: add a commit to that open pull request.")
@click.option("--tag", help="Tag the pushed commit (an immutable name for it).")
@click.option("--create-pr", is_flag=True,
              help="Propose the commit as a pull request (refs/pr/N) to the branch; the branch "
                   "does not move until it is merged.")
@click.option("--commit-message", help="Commit message.")
@click.option("--token", help="Hub token (default: HF_TOKEN or the stored login).")
@click.option("--allow-local-paths", is_flag=True,
              help="Push even though config.json names a model by a local path.")
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True),
              help="ECDSA P-256/P-384 private key (PEM): sign the cube (in place), then push.")
@click.option("--allow-unsigned", is_flag=True,
              help="Publish an unsigned cube over the branch's signed one (refused otherwise).")
@_timeout_option("push")
@_json_option()
def push_command(cube_dir: str, repo_id: str, repo_type: str, private: bool, revision: str | None,
                 tag: str | None, create_pr: bool, commit_message: str | None,
                 token: str | None, allow_local_paths: bool, sign_key: str | None,
                 allow_unsigned: bool, timeout: float | None, as_json: bool) -> None:
    """Verify CUBE_DIR and push what differs from REPO_ID's branch: one commit, or several
    (the lock last) above 100 files."""
    from .hub._push import push

    result = push(cube_dir, repo_id, repo_type=repo_type, private=private, revision=revision,
                  tag=tag, commit_message=commit_message, token=token,
                  allow_local_paths=allow_local_paths, timeout=timeout, create_pr=create_pr,
                  sign_key=sign_key, sign_password=_key_password() if sign_key else None,
                  allow_unsigned=allow_unsigned)
    _emit(result.to_dict(), as_json, _render_push)


def _render_push(data: dict[str, Any]) -> str:
    if not data["changed"]:
        line = (f"no changes: {data['repo_id']}@{data['branch']} already holds this cube "
                f"(commit {data['commit_sha']}); no commit made")
    else:
        line = (f"uploaded {len(data['uploaded'])} files (those that differ from the branch "
                "head, the lock included)"
                + (f", deleted {len(data['deleted'])}" if data["deleted"] else "")
                + f" to {data['repo_id']}@{data['branch']}\ncommit: {data['commit_sha']}"
                + (f"\nurl:    {data['commit_url']}" if data["commit_url"] else ""))
    if data["tag"]:
        line += f"\ntag:    {data['tag']}"
    if data["pr_revision"] and data["branch"] == data["pr_revision"]:  # added to an open one
        return line + (f"\nadded to pull request #{data['pr_num']} ({data['pr_revision']}); "
                       f"review it: cubepack pull {data['repo_id']}@{data['pr_revision']}")
    if data["pr_revision"]:
        return line.replace(f" to {data['repo_id']}@{data['branch']}",
                            f" as pull request #{data['pr_num']} to "
                            f"{data['repo_id']}@{data['branch']} (which did not move)") + (
            f"\npull request: #{data['pr_num']} ({data['pr_revision']})"
            + (f" {data['pr_url']}" if data["pr_url"] else "")
            + f"\nreview it: cubepack pull {data['repo_id']}@{data['pr_revision']} --local-dir "
              f"pr-{data['pr_num']}, then cubepack diff <a pull of {data['branch']}> "
              f"pr-{data['pr_num']}")
    return line + f"\npull it: cubepack pull {data['repo_id']}@{data['commit_sha']}"


@cli.command("pull")
@click.argument("repo")
@click.option("--revision", help="Branch, tag or commit (or write REPO@REV).")
@click.option("--repo-type", type=click.Choice(["dataset", "model"]), default="dataset",
              show_default=True)
@click.option("--local-dir", type=click.Path(file_okay=False),
              help="Where to place the cube (default: ./<name>). Replaced only after "
                   "verification. Each byte is on disk once, as with hf download --local-dir "
                   "(huggingface_hub's records inside DIR; nothing in the HF cache); an earlier "
                   "pull there is updated: unchanged files are hashed, not downloaded.")
@click.option("--verify/--no-verify", "verify_cube", default=True, show_default=True,
              help="Verify the downloaded commit before placing it.")
@click.option("--offline", is_flag=True,
              help="No request (also: HF_HUB_OFFLINE=1): served from --local-dir when an earlier "
                   "pull placed that commit there (hashed and verified again), else from the HF "
                   "cache.")
@click.option("--force", is_flag=True,
              help="Replace --local-dir even if it holds changed or other files (never your "
                   "cwd or home, nor a cache).")
@click.option("--include", "include", multiple=True, metavar="ITEM_OR_PATTERN",
              help="Pull only these memories (repeatable): a memory id, a cube path, or an "
                   "fnmatch pattern of either; a partial cube (verify: N of M memories "
                   "checked). A sharded cube's memories are fetched by byte range.")
@_timeout_option("pull")
@_identity_option()
@_policy_options()
def pull_command(repo: str, revision: str | None, repo_type: str, local_dir: str | None,
                 verify_cube: bool, offline: bool, force: bool, include: tuple[str, ...],
                 timeout: float | None, identity: str | None, token: str | None,
                 as_json: bool, **options: Any) -> None:
    """Pull REPO[@REV] at its exact commit, verify it, then place it at --local-dir."""
    from .hub._pull import pull

    result = pull(repo, _policy(options), revision=revision, repo_type=repo_type,
                  local_dir=local_dir, verify_cube=verify_cube, offline=offline, token=token,
                  force=force, timeout=timeout, decrypt_with=identity, include=include)
    _emit(result.to_dict(), as_json, _render_pull)


def _render_pull(data: dict[str, Any]) -> str:
    wanted = data["revision"] or "main"
    lines = [f"resolved {data['repo_id']}@{wanted} -> {data['commit_sha']}",
             f"placed at {data['local_dir']}"]
    if data["report"]:
        lines.append(_render_report(data["report"]))
    else:
        lines.append("not verified (--no-verify): run `cubepack verify` before loading it")
    return "\n".join(lines)


@cli.command("search")
@click.option("--model", "model", required=True,
              help="The model: a Hub id owner/name[@rev], a local folder, or a weights digest "
                   "sha256:<hex>.")
@click.option("--repo-type", type=click.Choice(["dataset", "model", "both"]), default="both",
              show_default=True, help="Which repos to list.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Candidates whose lock is read, at most (each one or two requests).")
@click.option("--all-cubes", "every_cube", is_flag=True,
              help="List every repo tagged cubepack, not only those whose card names the "
                   "model's weights (cubes packed before the tag).")
@click.option("--trusted-key", "trusted_keys", multiple=True,
              type=click.Path(dir_okay=False, exists=True),
              help="Public key (PEM): a match must be signed by one (repeatable).")
@click.option("--token", help="Hub token (default: HF_TOKEN or the stored login).")
@_timeout_option("search")
@_json_option()
def search_command(model: str, repo_type: str, limit: int, every_cube: bool,
                   trusted_keys: tuple[str, ...], token: str | None, timeout: float | None,
                   as_json: bool) -> None:
    """List the cubes on the endpoint (HF_ENDPOINT) whose pins match --model.

    The card's tags only narrow the list: a cube is a match once its lock, read at the commit
    the list names, pins the model (and, with --trusted-key, a trusted key signed that lock).
    """
    from .hub._search import search

    result = search(model, repo_type=None if repo_type == "both" else repo_type, limit=limit,
                    trusted_keys=list(trusted_keys), every_cube=every_cube, token=token,
                    timeout=timeout)
    _emit(result.to_dict(), as_json, _render_search)


def _render_search(data: dict[str, Any]) -> str:
    model = data["model"]
    where = f" ({model['repo_id']}@{model['revision']})" if model["repo_id"] else ""
    lines = [f"model {model['spec']}{where}: weights {model['weights_digest']}",
             f"  identity: {model['basis']}",
             f"listed {data['listed']} candidate{'s' if data['listed'] != 1 else ''} tagged "
             f"{data['hint']} at {data['endpoint']}; read {data['read']} (--limit "
             f"{data['limit']})" + ("; more were listed: raise --limit" if data["truncated"]
                                    else "")]
    for cube in data["matches"]:
        lines.append(f"match {cube['repo_id']}@{cube['revision']} ({cube['repo_type']}): "
                     f"{cube['memory_count']} memor{'ies' if cube['memory_count'] != 1 else 'y'}"
                     f", {cube['signature']}")
        for row in cube["roles"]:
            if row["match"]:
                state = "matches"
            elif row["match"] is None:
                state = row.get("note") or "not compared"
            else:
                state = "differs: " + "; ".join(
                    f"{d['field']} pinned {d['expected']}, model {d['found']}"
                    for d in row["differences"])
            lines.append(f"  {row['role']}: {state}")
    if not data["matches"]:
        lines.append("no cube matches")
    for cube in data["others"]:
        lines.append(f"not a match: {cube['repo_id']}@{cube['revision']} ({cube['repo_type']}):"
                     f" {cube['reason']}")
    return "\n".join(lines)


@cli.group("hub")
def hub_group() -> None:
    """A local Hub-compatible endpoint (for air-gapped teams, tests and the demo)."""


@hub_group.command("serve")
@click.option("--root", type=click.Path(file_okay=False), default="./cubepack-hub", show_default=True,
              help="Folder where repos, commits and blobs are stored.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (loopback unless you mean to share it).")
@click.option("--port", type=click.IntRange(0, 65535), default=8999, show_default=True)
@click.option("--token", "tokens", multiple=True,
              help="Accepted token (repeatable). With none, anyone who reaches the port may write.")
@click.option("--quiet", is_flag=True, help="No request log (one line per request otherwise).")
@click.option("--user", default="local", show_default=True,
              help="The account whoami reports; the namespace of repos created without one.")
@click.option("--max-upload-size", "max_upload", default="50G", show_default=True,
              metavar="SIZE", help="Largest file an upload may announce (bytes, or with K, M, G "
                                   "or T: powers of 1024); a larger one is refused up front.")
@_json_option(help="Print one JSON object once listening (url, root); the request log goes "
                   "to stderr.")
def hub_serve_command(root: str, host: str, port: int, tokens: tuple[str, ...],
                      quiet: bool, user: str, max_upload: str, as_json: bool) -> None:
    """Serve a local stand-in for the Hugging Face Hub (not a Hub replacement)."""
    from .localhub import LocalHub

    def log(line: str) -> None:
        # A log file sees each request as it happens; with --json, stdout holds only the JSON.
        print(line, flush=True, file=sys.stderr if as_json else sys.stdout)

    try:
        hub = LocalHub(root, host=host, port=port, tokens=list(tokens),
                       log=None if quiet else log, user=user,
                       max_upload_bytes=_size(max_upload, "--max-upload-size"))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise UsageError(f"Cannot listen on {host}:{port}: {exc.strerror}. Choose another "
                             "port with --port (or another --host).") from exc
        raise
    open_to_all = "no --token given: anyone who can reach this port may create and push repos"
    hidden = [] if tokens else hub.store.private_repos()
    if hidden:  # a root served with tokens before: its private repos stay private, unserved
        count = f"{len(hidden)} private repo{'s' if len(hidden) != 1 else ''}"
        open_to_all += (f"\n{count} in {root} not served: without --token no repo can be "
                        "private (restart with --token to serve them)")
    unserved = hub.store.unserved()
    if unserved:  # made before the endpoint followed the client's rule for ids
        several = len(unserved) != 1
        click.echo(f"{len(unserved)} repo folder{'s' if several else ''} under {root}/repos "
                   f"{'have ids' if several else 'has an id'} huggingface_hub refuses (e.g. "
                   f"{unserved[0].relative_to(Path(root) / 'repos').as_posix()}): not served; "
                   "rename them to serve them", err=True)
    _emit({"url": hub.url, "root": os.path.abspath(root), "tokens": len(tokens),
           "private_repos_not_served": len(hidden)}, as_json,
          lambda data: f"serving {root} at {data['url']}  (use: HF_ENDPOINT={data['url']}; "
                       "Ctrl-C stops)" + ("" if tokens else f"\n{open_to_all}"))
    sys.stdout.flush()
    if not tokens and as_json:
        click.echo(open_to_all, err=True)
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        hub.stop()


def _size(text: str, option: str) -> int:
    """A size from the command line: digits, optionally followed by K, M, G or T (x1024)."""
    match = re.fullmatch(r"\s*([0-9]{1,15})\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise UsageError(f"{option} takes a size in bytes, or with K, M, G or T (e.g. 50G), not "
                         f"{text!r}.")
    return int(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_")


@hub_group.command("gc")
@click.argument("root", type=click.Path(file_okay=False))
@_json_option(help="Print one JSON object: removed, freed, expired_uploads, kept.")
def hub_gc_command(root: str, as_json: bool) -> None:
    """Remove the blobs no repo of ROOT holds (safe while `cubepack hub serve` runs on it).

    A blob is kept while a commit of any repo names it, or an upload for a repo made it less
    than a day ago (a push in progress); the records of older uploads are removed first.
    """
    from .localhub import collect_garbage

    if not (Path(root) / "blobs").is_dir():
        raise UsageError(f"{root} is not the root of a local endpoint (it has no blobs folder); "
                         "name the folder `cubepack hub serve --root` serves.")
    done = collect_garbage(root)
    _emit(done.as_dict(), as_json,
          lambda data: f"removed {data['removed']} blob{'s' if data['removed'] != 1 else ''} "
                       f"({data['freed']} bytes) no repo holds; kept {data['kept']}; "
                       f"expired {data['expired_uploads']} abandoned upload record"
                       f"{'s' if data['expired_uploads'] != 1 else ''}")


def _runtime_group(name: str, doc: str) -> Any:
    """The ``import`` / ``export`` group, made once whichever runtime registers first."""
    group = cli.commands.get(name)
    if group is None:
        group = click.Group(name, help=doc)
        cli.add_command(group)
    return group


@_runtime_group("import", "Convert another runtime's KV cache into a cubepack KV file.").command(
    "llamacpp")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--gguf", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The GGUF llama.cpp ran: pinned by its sha256.")
@click.option("--model", required=True, help="The Hugging Face folder (or Hub id) the GGUF was "
                                             "converted from: its fingerprint is the producer.")
@click.option("--revision", help="Branch, tag or commit of a Hub --model.")
@click.option("--out", type=click.Path(dir_okay=False),
              help="The KV file to write (default: FILE's stem + .kv.safetensors).")
@click.option("--recompute", is_flag=True, help="Prove it first: transformers runs --model on "
                                                "the state's tokens and must reproduce it.")
@_json_option()
def import_llamacpp_command(file: str, gguf: str, model: str, revision: str | None,
                            out: str | None, recompute: bool, as_json: bool) -> None:
    """Convert a llama.cpp session FILE (llama_state_save_file) into a KV file pinned to GGUF
    and MODEL."""
    from .kv._format import read_kv_header
    from .llamacpp import import_state

    path = import_state(file, gguf, model, out=out, revision=revision, recompute=recompute)
    info = read_kv_header(path)
    _emit({"path": str(path), "token_count": info.token_count, "kv_dtype": info.kv_dtype,
           "runtime": info.metadata.get("runtime"), "gguf": info.metadata.get("gguf"),
           "provenance": info.metadata.get("provenance"), "producer": info.producer.to_dict()},
          as_json, lambda d: f"imported {d['token_count']} positions ({d['kv_dtype']}, "
                             f"{d['runtime']}) to {d['path']} ({d['provenance']['kind']})")


@_runtime_group("export", "Write a cubepack KV file in another runtime's cache format.").command(
    "llamacpp")
@click.argument("kvfile", type=click.Path(exists=True))
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="The llama.cpp session file to write (its pin goes beside it, "
                   "FILE.cubepack.json).")
@_item_option()
@click.option("--gguf", type=click.Path(dir_okay=False, exists=True),
              help="Refuse unless KVFILE pins this GGUF.")
@click.option("--flash-attn", is_flag=True, help="For a llama.cpp context with flash attention "
                                                 "(values not transposed).")
@_json_option()
def export_llamacpp_command(kvfile: str, out: str, item: str | None, gguf: str | None,
                            flash_attn: bool, as_json: bool) -> None:
    """Write KVFILE (or a cube's memory --item) as a llama.cpp session file, pinned to the
    GGUF it records."""
    _export_source(kvfile, item)
    from .llamacpp import export_state
    from .llamacpp._convert import pin_path

    path = export_state(kvfile, out, gguf=gguf, v_trans=not flash_attn, item=item)
    _emit({"path": str(path), "pin": str(pin_path(path))}, as_json,
          lambda d: f"exported to {d['path']} (pin: {d['pin']})")


def _wants_json(args: list[str]) -> bool:
    """Did the command line ask for JSON? As click parsed it once it has; before that (a usage
    error) ``--json`` or ``--json=...`` anywhere on the line, the only evidence there is."""
    if _Context.as_json is not None:
        return _Context.as_json
    return any(arg == "--json" or arg.startswith("--json=") for arg in args)


def interrupted(args: list[str]) -> int:
    """A command stopped by Ctrl-C, at any moment (also while the command line loads: see
    ``cubepack.__main__``): one line on stderr, one JSON object on stdout when asked for, exit
    130. A second Ctrl-C cannot break the goodbye into a traceback."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    click.echo("error: interrupted (Ctrl-C) before the command finished", err=True)
    if _wants_json(args):
        click.echo(json.dumps({"ok": False, "error": {
            "type": "Interrupted", "exit_code": INTERRUPTED_EXIT,
            "message": "interrupted (Ctrl-C) before the command finished"}, "report": None},
            indent=2, sort_keys=True))
    return INTERRUPTED_EXIT


def terminated(args: list[str], exc: Terminated) -> int:
    """A command stopped by SIGTERM, SIGHUP, SIGQUIT or SIGUSR1: one line on stderr, one JSON
    object when asked, exit 128 + the signal's number (143 for SIGTERM)."""
    click.echo(f"error: {exc}", err=True)
    if _wants_json(args):
        click.echo(json.dumps({"ok": False, "error": {
            "type": "Terminated", "exit_code": exc.exit_code, "message": str(exc)},
            "report": None}, indent=2, sort_keys=True))
    return exc.exit_code


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the CLI and map errors to exit codes.

    With ``--json``, a refusal or error is also printed as JSON on stdout (``ok: false``, the
    error's type, message and exit code, and the verification report when there is one), so a
    script reading stdout always gets JSON.
    """
    from ._util.ramdir import signals_unwind

    args = list(sys.argv[1:] if argv is None else argv)
    _Context.as_json = None
    try:
        # SIGTERM (kill, timeout, docker stop), SIGHUP (a closed terminal), SIGQUIT, SIGUSR1
        # unwind as Ctrl-C does: finally blocks remove temp files and decrypted RAM folders,
        # then one line and exit 128 + the signal.
        with signals_unwind(), _ctrl_c_remembered():
            return _run(args)
    except KeyboardInterrupt:  # while an error was being printed: still one outcome
        return interrupted(args)
    except Terminated as exc:
        return terminated(args, exc)


#: Set when a Ctrl-C reached this process during a command. A library may turn the
#: KeyboardInterrupt it raised into an error of its own (transformers' lazy imports re-raise it
#: as "Could not import module ..."): an error after a Ctrl-C is still the interruption.
_CTRL_C = threading.Event()


@contextlib.contextmanager
def _ctrl_c_remembered() -> Iterator[None]:
    import signal

    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield  # someone else handles Ctrl-C here (a test runner, an embedding program)
        return

    def on_ctrl_c(signum: int, frame: Any) -> None:
        _CTRL_C.set()
        raise KeyboardInterrupt

    _CTRL_C.clear()
    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is on_ctrl_c:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _run(args: list[str]) -> int:
    try:
        # click's own main would print a blank line before our one line on Ctrl-C: the
        # command is run as click.main runs it, its outcomes mapped here.
        with cli.make_context("cubepack", args) as ctx:
            cli.invoke(ctx)
    except click.exceptions.Exit as exc:  # --help, --version
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt, EOFError):  # Ctrl-C, or end of input
        return interrupted(args)
    except click.exceptions.ClickException as exc:
        exc.show()
        if _wants_json(args):  # a usage error is an outcome too: one JSON object, as ever
            _emit_error(UsageError(exc.format_message()))
        return 2
    except CubepackError as exc:
        if _CTRL_C.is_set():  # an error a Ctrl-C caused (see _CTRL_C)
            return interrupted(args)
        if _Context.debug:
            traceback.print_exc()
        report = getattr(exc, "report", None)
        if _wants_json(args):
            _emit_error(exc)
        elif report is not None:  # the whole report on stdout, as on success
            click.echo(_render_report(report.to_dict()))
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        if _CTRL_C.is_set():  # an error a Ctrl-C caused (see _CTRL_C)
            return interrupted(args)
        if _Context.debug:
            traceback.print_exc()
        click.echo(f"error: unexpected {type(exc).__name__}: {exc} (rerun with --debug for the "
                   "traceback)", err=True)
        if _wants_json(args):
            unexpected = CubepackError(f"unexpected {type(exc).__name__}: {exc}")
            _emit_error(unexpected)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
