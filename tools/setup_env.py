"""Build one virtual environment for ``make``: ``setup_env.py [--uv UV] [--no-deps REQ] VENV REQUIREMENT...``.

With uv (``--uv``: a path or a command; the Makefile installs it from PyPI into
``$(VENV)/tools``), the environment is made from scratch by ``uv venv --seed`` and filled by
one ``uv pip install``, which resolves in seconds and links every package from one download
cache, so the second environment costs little more than its own packages; it compiles their
bytecode as it installs (as pip does; uv by default leaves it to each first import). uv does
not read pip's configuration, so this script hands it pip's, as pip itself would apply it
(``pip config list``: index URLs, find-links, constraint files, trusted hosts, the certificate
bundle, proxy, timeout), with pip's rule of taking the best version across all indexes.

Without uv (``--uv ''``, i.e. ``make UV=``, or when uv could not be installed), the environment
is made with ``venv`` and pip: torch alone first, then the rest.

Either way the plan is checked before anything is installed: a CUDA package in it (an
``nvidia-*``, ``cuda-*`` or ``triton`` distribution, or a ``+cu`` build of torch, several GB)
stops the build, naming it. With uv the whole plan is checked; with pip, torch's (the only
requirement here that brings CUDA, and the second step keeps the torch the first installed).
Standard library only: it runs on the interpreter that makes the environments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: Distributions that only a CUDA build brings: their presence in a plan means GBs to fetch.
CUDA_PREFIXES = ("nvidia-", "cuda-")
CUDA_NAMES = ("triton", "pytorch-triton")
#: pip's sections, lowest priority first: ``install`` overrides ``global``, and ``PIP_*``
#: variables (``:env:``) override both.
PIP_SECTIONS = ("global", "install", ":env:")
#: pip options that take several whitespace-separated values.
PIP_LISTS = ("extra-index-url", "find-links", "constraint", "trusted-host")
#: pip option -> uv option, for the options both the venv seed and the install need.
INDEX_FLAGS = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
               ("find-links", "--find-links"), ("trusted-host", "--allow-insecure-host"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uv", default="", help="uv to use (a path or a command); '' for pip")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter the environment is made from (default: this one)")
    parser.add_argument("--no-deps", action="append", default=[], metavar="REQUIREMENT",
                        help="then install the newest release this admits, without its "
                             "dependencies (one whose declared dependencies the registry lacks)")
    parser.add_argument("venv", type=Path)
    parser.add_argument("requirements", nargs=argparse.REMAINDER,
                        help="what to install, as pip takes it (-e . included)")
    args = parser.parse_args(argv)
    if not args.requirements:
        parser.error("nothing to install")
    python = shutil.which(args.python) or args.python
    uv = find_uv(args.uv)
    if args.uv and uv is None:
        print(f"setup: uv ({args.uv}) is not available: building {args.venv} with pip",
              flush=True)
    began = time.monotonic()
    build = _with_uv if uv else _with_pip
    status = build(uv, python, args.venv, args.requirements)
    if status == 0 and args.no_deps:
        status = _without_deps(uv, python, args.venv, args.no_deps)
    if status == 0:
        print(f"setup: {args.venv} ready in {time.monotonic() - began:.0f} s "
              f"({'uv' if uv else 'pip'})", flush=True)
    return status


def find_uv(uv: str) -> str | None:
    """The uv to run: ``''`` means none; a path must be executable; a bare name is looked up
    on PATH."""
    if not uv:
        return None
    if os.sep in uv:
        return uv if os.access(uv, os.X_OK) else None
    return shutil.which(uv)


def parse_pip_config(listing: str) -> dict[str, str]:
    """pip's effective install settings from ``pip config list`` output
    (``global.find-links='/opt/wheels'``): per option, the value of the highest-priority
    section pip reads for ``pip install`` (other commands' sections are ignored)."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.strip().rpartition(".")
        if not (sep and dot and name) or section not in PIP_SECTIONS:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        rank = PIP_SECTIONS.index(section)
        if name not in chosen or rank >= chosen[name][0]:
            chosen[name] = (rank, value)
    return {name: value for name, (_, value) in chosen.items()}


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def uv_settings(pip: dict[str, str]) -> tuple[list[str], list[str], dict[str, str]]:
    """(index options for ``uv venv`` and ``uv pip install``, options for ``uv pip install``
    only, environment variables) that make uv see what pip sees with these settings."""
    index: list[str] = []
    lists = {name: pip.get(name, "").split() for name in PIP_LISTS}
    for name, flag in INDEX_FLAGS:
        values = lists[name] if name in lists else pip.get(name, "").split()[:1]
        for value in dict.fromkeys(values):  # each once, in pip's order
            index += [flag, value]
    if _true(pip.get("no-index")):
        index.append("--no-index")
    if lists["extra-index-url"] or lists["find-links"]:
        index += ["--index-strategy", "unsafe-best-match"]  # pip's rule: best of all
    install = [option for value in dict.fromkeys(lists["constraint"])
               for option in ("--constraint", value)]
    environment: dict[str, str] = {}
    if pip.get("cert"):
        environment["SSL_CERT_FILE"] = pip["cert"]
    if pip.get("client-cert"):
        environment["SSL_CLIENT_CERT"] = pip["client-cert"]
    if pip.get("proxy"):
        environment["HTTP_PROXY"] = environment["HTTPS_PROXY"] = pip["proxy"]
    timeout = pip.get("timeout") or pip.get("default-timeout")
    if timeout:
        environment["UV_HTTP_TIMEOUT"] = timeout
    return index, install, environment


def planned_by_uv(output: str) -> list[str]:
    """``name==version`` of each package ``uv pip install --dry-run`` would install
    (its `` + name==version`` lines)."""
    return [line.split()[1] for line in output.splitlines()
            if line.strip().startswith("+ ") and len(line.split()) > 1]


def planned_by_pip(report: str) -> list[str]:
    """``name==version`` of each package in a ``pip install --dry-run --report -`` report."""
    try:
        items = json.loads(report).get("install", [])
    except (ValueError, AttributeError):
        return []
    return [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in items
            if isinstance(item, dict) and "metadata" in item]


def cuda_packages(planned: list[str]) -> list[str]:
    """The entries of a plan that mean a CUDA download: NVIDIA/CUDA/triton distributions and
    a torch whose local version names a CUDA build (``torch==2.13.0+cu130``)."""
    found = []
    for entry in planned:
        name, _, version = entry.partition("==")
        normal = re.sub(r"[-_.]+", "-", name).lower()
        if normal.startswith(CUDA_PREFIXES) or normal in CUDA_NAMES or (
                normal == "torch" and "+cu" in version):
            found.append(entry)
    return found


def _refuse_cuda(cuda: list[str], tool: str) -> int:
    sys.stderr.write(
        f"setup: {tool} would install {', '.join(cuda)}: a CUDA build of torch (several GB).\n"
        "Nothing was installed. Put the CPU wheel of the pinned torch where pip finds it "
        "(e.g. a find-links folder in pip's configuration).\n")
    return 1


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("  " + shlex.join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def _pip_config(python: str) -> dict[str, str]:
    done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, check=False)
    return parse_pip_config(done.stdout)


def _with_pip(_uv: None, python: str, venv: Path, requirements: list[str]) -> int:
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--quiet",
           "--disable-pip-version-check"]
    _run([python, "-m", "venv", str(venv)])
    torch = [r for r in requirements if re.match(r"torch\b", r)]
    if torch:  # alone first, so nothing else can choose another torch
        plan = subprocess.run(pip + ["--dry-run", "--report", "-"] + torch,
                              capture_output=True, text=True, check=False)
        if plan.returncode:
            sys.stderr.write(plan.stdout + plan.stderr)
            return plan.returncode
        cuda = cuda_packages(planned_by_pip(plan.stdout))
        if cuda:
            return _refuse_cuda(cuda, "pip")
        _run(pip + torch)
    _run(pip + requirements)
    return 0


def _with_uv(uv: str, python: str, venv: Path, requirements: list[str]) -> int:
    index, install_only, environment = uv_settings(_pip_config(python))
    env = {**os.environ, **environment}
    if venv.exists():  # rebuilt from scratch: seconds with uv's cache
        shutil.rmtree(venv)
    _run([uv, "venv", "--quiet", "--seed", "--no-python-downloads", "--python", python, *index,
          str(venv)], env=env)
    install = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), *index,
               *install_only, *requirements]
    plan = subprocess.run(install + ["--dry-run"], env=env, capture_output=True, text=True,
                          check=False)
    if plan.returncode:
        sys.stderr.write(plan.stdout + plan.stderr)
        return plan.returncode
    planned = planned_by_uv(plan.stdout + plan.stderr)
    cuda = cuda_packages(planned)
    if cuda:
        return _refuse_cuda(cuda, "uv")
    torch = [entry for entry in planned if entry.lower().startswith("torch==")]
    print(f"  plan: {len(planned)} packages, no CUDA package"
          + (f", {torch[0]}" if torch else ""), flush=True)
    # uv leaves bytecode to the first import; where bytecode is not written (the
    # PYTHONDONTWRITEBYTECODE our machines set) every process would compile each module it
    # imports from source: ~2.5x the CPU of an import of transformers. Compile it now, as pip does.
    _run(install + ["--quiet", "--compile-bytecode"], env=env)
    return 0


def _without_deps(uv: str | None, python: str, venv: Path, requirements: list[str]) -> int:
    """Install the newest release each of ``requirements`` admits over the built environment,
    without its dependencies: the environment a user has who installs the newest release where
    a dependency it declares is not to be had (transformers 5.25 declares kernels>=0.19.1,
    which a registry may lack), which a resolver would step back from."""
    target = str(venv / "bin" / "python")
    if uv:
        index, install_only, environment = uv_settings(_pip_config(python))
        _run([uv, "pip", "install", "--python", target, *index, *install_only, "--no-deps",
              "--upgrade", "--quiet", "--compile-bytecode", *requirements], env={**os.environ, **environment})
    else:
        _run([target, "-m", "pip", "install", "--quiet", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--upgrade", *requirements])
    return 0


if __name__ == "__main__":
    sys.exit(main())
