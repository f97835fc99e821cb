"""Run MemOS's own tests plain and with ``cubepack.memos.install()``, and compare the outcomes.

1. takes the tests below (and the example data they read) from a MemOS checkout: a git
   directory (a bare mirror too; ``--rev``, default HEAD) or a working tree, into a temporary
   folder (nothing of MemOS is kept or vendored here);
2. runs them twice with this interpreter against the *installed* ``memos`` (MemOS's
   ``pythonpath = "src"`` is not used): plain, then with the hook installed before any test
   runs (this file is also the pytest plugin that installs it, ``-p memos_own_tests``);
3. prints test / plain / hooked and fails on any difference not listed, with its reason, in
   ``tools/memos_own_tests_expected.txt``, on a listed test whose hooked run does not end in the
   typed error its entry names, and on a listed test that no longer differs (the list only
   shrinks).

Run: .venv/memos/bin/python tools/memos_own_tests.py MEMOS_CHECKOUT [--rev REV]

The checkout is an argument, never a default: MemOS's PyPI sdist ships no tests (checked for
2.0.33), so there is nothing to fetch as hub_compat fetches its sources; clone it with
``git clone https://github.com/MemTensor/MemOS`` (any revision; the installed memos is tested).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tools" / "memos_own_tests_expected.txt"
#: MemOS's tests of cube loading/dumping, activation (KV) memories, the HF LLM that consumes
#: caches, MOSCore registration and the scheduler's activation updates; their helpers and data.
PATHS = ("tests/__init__.py", "tests/utils.py", "tests/configs/__init__.py",
         "tests/configs/test_mem_cube.py", "tests/configs/test_memory.py",
         "tests/mem_cube", "tests/memories/__init__.py", "tests/memories/test_factory.py",
         "tests/memories/activation", "tests/mem_os", "tests/llms/__init__.py",
         "tests/llms/test_hf.py", "tests/llms/test_vllm.py", "tests/mem_scheduler/__init__.py",
         "tests/mem_scheduler/test_scheduler.py", "examples/data/mem_cube_2",
         "examples/data/config/mem_scheduler", "src/memos/__init__.py")
HOOK_ENV = "MEMOS_OWN_TESTS_HOOK"


def pytest_configure(config):  # this module as a pytest plugin (-p memos_own_tests)
    if os.environ.get(HOOK_ENV) == "1":
        import cubepack.memos

        cubepack.memos.install(require_pin=False)


def pytest_sessionfinish(session):
    mod = sys.modules.get("cubepack.memos")
    state = "hooked" if mod is not None and mod.installed() else "plain"
    Path(os.environ["MEMOS_OWN_TESTS_STATE"]).write_text(state)  # MemOS may discover plugins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", help="MemOS git directory (a bare mirror too) or working "
                        "tree, e.g. from git clone https://github.com/MemTensor/MemOS")
    parser.add_argument("--rev", default="HEAD", help="revision, for a git directory")
    args = parser.parse_args()
    if not Path(args.checkout).is_dir():
        parser.error(f"{args.checkout} is not a folder: give a MemOS checkout "
                     "(git clone https://github.com/MemTensor/MemOS)")
    import memos

    with tempfile.TemporaryDirectory(prefix="memos-own-tests-") as tmp:
        work = Path(tmp) / "memos"
        where = _extract(Path(args.checkout), args.rev, work)
        init = work / "src" / "memos" / "__init__.py"
        tested = next((line.split('"')[1] for line in init.read_text().splitlines()
                       if line.startswith("__version__")), "?") if init.exists() else "?"
        shutil.rmtree(work / "src", ignore_errors=True)  # the installed memos is tested
        print(f"MemOS tests from {where} (version {tested}); installed memos "
              f"{memos.__version__}" + ("" if tested == memos.__version__ else
                                         " (not the same version: outcomes may differ)"))
        (work / "pytest.ini").write_text("[pytest]\n")  # not the checkout's pyproject
        plain, hooked = (_run(work, Path(tmp), mode) for mode in ("plain", "hooked"))
    return _compare(plain, hooked)


def _extract(checkout: Path, rev: str, work: Path) -> str:
    work.mkdir(parents=True)
    git = ["git", f"--git-dir={checkout / '.git' if (checkout / '.git').exists() else checkout}"]
    commit = subprocess.run([*git, "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True, check=False)
    if commit.returncode:  # a plain folder (not a git directory): copy what is there
        for path in PATHS:
            source = checkout / path
            if source.is_dir():
                shutil.copytree(source, work / path)
            elif source.is_file():
                (work / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, work / path)
        return str(checkout)
    sha = commit.stdout.strip()
    present = subprocess.run([*git, "ls-tree", "--name-only", sha, "--", *PATHS],
                             capture_output=True, text=True, check=True).stdout.split()
    archive = subprocess.run([*git, "archive", sha, "--", *present], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    return f"{checkout} at {sha}"


def _run(work: Path, tmp: Path, mode: str) -> dict[str, tuple[str, str]]:
    report, state = tmp / f"{mode}.xml", tmp / f"{mode}.state"
    paths = [str(ROOT), str(ROOT / "tools"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1",
               MEMOS_BASE_PATH=str(tmp / f"{mode}-memos"),
               CUBEPACK_CACHE=str(tmp / f"{mode}-cubepack"),
               MEMOS_OWN_TESTS_STATE=str(state), **{HOOK_ENV: "1" if mode == "hooked" else "0"})
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                    "memos_own_tests", f"--junitxml={report}", "tests"], cwd=work, env=env,
                   stdout=subprocess.DEVNULL, check=False)
    if not report.exists() or not state.exists() or state.read_text() != mode:
        sys.exit(f"The {mode} run did not run as {mode} (hook state: "
                 f"{state.read_text() if state.exists() else 'unknown'}).")
    return _outcomes(report)


def _outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, first line of its message)."""
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = " ".join((element.get("message") or "").split())[:150]
                break
        found[test_id] = (outcome, message)
    return found


def _compare(plain: dict, hooked: dict) -> int:
    listed = {}
    if LIST.exists():
        for line in LIST.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                test_id, _, reason = line.partition("  # ")
                listed[test_id.strip()] = reason.strip()
    missing = ("not run", "")
    tests = sorted(set(plain) | set(hooked))
    differ = {t for t in tests if plain.get(t, missing)[0] != hooked.get(t, missing)[0]}
    width = max(map(len, tests), default=4)
    print(f"\n  {'test':<{width}}  {'plain':<8} hooked")
    for test_id in tests:
        mark = ("!" if test_id not in listed else "~") if test_id in differ else " "
        print(f"{mark} {test_id:<{width}}  {plain.get(test_id, missing)[0]:<8} "
              f"{hooked.get(test_id, missing)[0]}")
    for mode, outcomes in (("plain", plain), ("hooked", hooked)):
        counts = {}
        for outcome, _ in outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{mode}: " + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())))
    unexpected = sorted(differ - set(listed))
    gone = sorted(set(listed) - differ)
    wrong_error = []
    for test_id in sorted(differ & set(listed)):
        print(f"~ expected difference: {test_id}: {listed[test_id]}")
        # An entry names the typed error the hooked run must end in; any other failure (a raw
        # library error, say) is not the listed difference.
        error = listed[test_id].split(":", 1)[0]
        if error not in hooked.get(test_id, missing)[1]:
            wrong_error.append(test_id)
            print(f"! {test_id}: listed as ending in {error}, but the hooked run says: "
                  f"{hooked.get(test_id, missing)[1]}")
    for test_id in unexpected:
        print(f"! unexpected difference: {test_id}: plain {plain.get(test_id, missing)[0]}, "
              f"hooked {hooked.get(test_id, missing)[0]}: "
              f"{hooked.get(test_id, missing)[1] or plain.get(test_id, missing)[1]}")
    for test_id in gone:
        print(f"  no longer differs, remove it from {LIST.name}: {test_id}")
    return 1 if unexpected or gone or wrong_error else 0


if __name__ == "__main__":
    sys.exit(main())
