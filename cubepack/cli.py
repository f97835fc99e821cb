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


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the CLI and map errors to exit codes."""
    try:
        cli.main(args=argv, prog_name="cubepack", standalone_mode=False)
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
