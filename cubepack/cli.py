"""The ``cubepack`` command line: parse arguments, call the Python API, print the result.

Exit codes: 0 ok, 1 verification refused, 2 usage error, 3 any other error. Errors print one
line; ``--debug`` adds the traceback. Heavy libraries are imported inside each command so that
``cubepack --help`` stays instant and torch-free.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any, Callable

import click

from .errors import CubepackError


class _Context:
    debug = False


def _emit(data: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        click.echo(render(data))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="cubepack")
def cli(debug: bool) -> None:
    """cubepack: pin, lock, verify and share LLM memory cubes and KV caches.

    Exit codes: 0 ok, 1 verification refused, 2 usage error, 3 other error.
    """
    _Context.debug = debug


@cli.command("fingerprint")
@click.argument("model")
@click.option("--revision", help="Branch, tag or commit, for a Hub model id.")
@click.option("--dtype", help="The dtype the model runs in, when not its stored dtype.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def fingerprint_command(model: str, revision: str | None, dtype: str | None, as_json: bool) -> None:
    """Print the identity of MODEL (a local folder or a Hub model id)."""
    from .fingerprints import fingerprint

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
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def inspect_command(file: str, as_json: bool) -> None:
    """Show a KV file's format version, producer, shapes and token count."""
    from .kvfile import read_kv_header

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
        f"producer:    {producer['model_id'] or '(local model)'}"
        + (f"@{producer['revision']}" if producer.get("revision") else ""),
        f"  weights:   {producer['weights_digest']}",
        f"  tokenizer: {producer['tokenizer_digest']}",
        f"  dtype:     {producer['dtype']}",
    ]
    if data["metadata"]:
        lines.append(f"metadata:    {json.dumps(data['metadata'], sort_keys=True)[:200]}")
    return "\n".join(lines)


@cli.command("pack")
@click.argument("cube_dir", type=click.Path(file_okay=False))
@click.option("--model", help="Producer model (folder or Hub id); overrides config.json's act_mem LLM.")
@click.option("--revision", help="Branch, tag or commit of a Hub --model to pin.")
@click.option("--legacy-pickle", is_flag=True,
              help="Convert MemOS activation pickles to KV files (allowlist unpickler).")
@click.option("--license", "license_", help="License for the card's metadata (e.g. apache-2.0).")
@click.option("--pretty-name", help="Title of the model card.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pack_command(cube_dir: str, model: str | None, revision: str | None, legacy_pickle: bool,
                 license_: str | None, pretty_name: str | None, as_json: bool) -> None:
    """Pin, lock and card the cube in CUBE_DIR, in place and atomically."""
    from .pack import pack

    result = pack(cube_dir, model=model, revision=revision, legacy_pickle=legacy_pickle,
                  license=license_, pretty_name=pretty_name)
    _emit(result.to_dict(), as_json, _render_pack)


def _render_pack(data: dict[str, Any]) -> str:
    lines = [f"packed {data['cube_dir']}" + ("" if data["changed"] else " (unchanged)"),
             f"  files:       {data['files']}",
             f"  activations: {len(data['activations'])}"
             + (f" ({len(data['converted'])} converted from the MemOS pickle)" if data["converted"] else "")]
    for role, pin in data["models"].items():
        where = f"{pin['repo_id']}@{pin['revision']}" if pin["revision"] else \
            f"{pin['name']} (no Hub revision: pinned by weights digest)"
        lines.append(f"  model {role}: {where}")
    lines.append(f"  lock digest: {data['digest']}")
    return "\n".join(lines)


@cli.command("verify")
@click.argument("cube_dir", type=click.Path(file_okay=False))
@click.option("--model", help="Check the pins against this model (folder or Hub id).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def verify_command(cube_dir: str, model: str | None, as_json: bool) -> None:
    """Verify CUBE_DIR against its lock: files, hashes, KV headers, pins. Exit 1 on refusal."""
    from .verify import verify

    report = verify(cube_dir, model=model, raise_on_failure=False)
    _emit(report.to_dict(), as_json, _render_report)
    if not report.ok:
        raise _Refused()


class _Refused(Exception):
    """Verification printed its report and refused: exit 1 without another message."""


def _render_report(data: dict[str, Any]) -> str:
    marks = {True: "ok  ", False: "FAIL", None: "skip"}
    lines = []
    for check in data["checks"]:
        line = f"{marks[check['ok']]} {check['check']:<15} {check['subject']}: {check['detail']}"
        if check["expected"] is not None or check["found"] is not None:
            line += f"\n     expected {check['expected']}\n     found    {check['found']}"
        lines.append(line)
    lines.append("verified: the cube is exactly what was packed" if data["ok"]
                 else "REFUSED: do not load this cube")
    return "\n".join(lines)


@cli.command("diff")
@click.argument("a", type=click.Path(exists=True))
@click.argument("b", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def diff_command(a: str, b: str, as_json: bool) -> None:
    """Show what changed from cube (or lock) A to B."""
    from .diff import diff

    _emit(diff(a, b), as_json, _render_diff)


def _render_diff(data: dict[str, Any]) -> str:
    if data["same"]:
        return "identical locks"
    lines = []
    for section in ("files", "activations"):
        for kind in ("added", "removed", "changed"):
            for name in data[section][kind]:
                lines.append(f"{section[:-1] if section == 'files' else 'activation'} {kind}: {name}")
    for role, changes in data["models"].items():
        for key, change in changes.items():
            lines.append(f"model {role} {key}: {change}")
    return "\n".join(lines) or "no differences in files, models or activations"


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the CLI and map errors to exit codes."""
    try:
        cli.main(args=argv, prog_name="cubepack", standalone_mode=False)
    except _Refused:
        return 1
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 3
    except click.exceptions.ClickException as exc:
        exc.show()
        return 2
    except CubepackError as exc:
        if _Context.debug:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        if _Context.debug:
            traceback.print_exc()
        click.echo(f"error: unexpected {type(exc).__name__}: {exc} (rerun with --debug for the "
                   "traceback)", err=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
