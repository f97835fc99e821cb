"""Run huggingface_hub's own test suite against ``cubepack hub serve`` (``make hub-compat``).

1. downloads the sdist of the *installed* huggingface_hub version from the package registry
   (the tests ship in it) into ``.cache/hub-compat/``;
2. points its staging endpoint at a local ``cubepack hub serve`` started with the suite's
   tokens and user, and adds the small ``conftest.py`` the sdist lacks;
3. runs the repo, commit, download, refs, file-system and cache-layout tests (``-m "not
   production"``, Xet off);
4. compares the outcome with ``tools/hub_compat_out_of_scope.txt`` (one test id per line, with
   the reason): a failure outside that list fails the run, and so does a listed test that now
   passes (the list only shrinks).

Run: .venv/latest/bin/python tools/hub_compat.py [--update-list]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "hub-compat"
LIST = ROOT / "tools" / "hub_compat_out_of_scope.txt"
MODULES = ("test_hf_api.py", "test_file_download.py", "test_snapshot_download.py",
           "test_hf_file_system.py", "test_commit_scheduler.py", "test_copy_files.py",
           "test_cache_layout.py")
CONFTEST = '''
"""The conftest huggingface_hub's sdist does not ship, as small as its tests need."""
import os

import pytest
from huggingface_hub import HfApi

from .testing_constants import ENDPOINT_STAGING, TOKEN
from .testing_utils import repo_name


class RepoFactory:
    def __init__(self, api):
        self.api = api

    def __call__(self, repo_type="model", repo_id=None, private=False, **kwargs):
        name = repo_name(repo_id) if repo_id else repo_name()
        return self.api.create_repo(name, repo_type=repo_type, private=private, **kwargs)


@pytest.fixture(scope="session")
def api():
    return HfApi(endpoint=ENDPOINT_STAGING, token=TOKEN)


@pytest.fixture
def repo_factory(api):
    return RepoFactory(api)


@pytest.fixture
def api_prod():
    pytest.skip("production Hub")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("production") or item.get_closest_marker("xet"):
            item.add_marker(pytest.mark.skip(reason="production Hub or Xet"))
'''


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--update-list", action="store_true",
                        help="rewrite the out-of-scope list with today's failures (to triage)")
    args = parser.parse_args()
    import huggingface_hub

    from cubepack.testing import free_port

    version = huggingface_hub.__version__
    tests = _sources(version)
    port = free_port()
    constants = (tests / "testing_constants.py").read_text()
    token = re.search(r'^TOKEN = "([^"]+)"', constants, re.MULTILINE).group(1)
    other = re.search(r'^OTHER_TOKEN = "([^"]+)"', constants, re.MULTILINE).group(1)
    user = re.search(r'^USER = "([^"]+)"', constants, re.MULTILINE).group(1)
    server = subprocess.Popen([sys.executable, "-m", "cubepack", "hub", "serve", "--quiet",
                               "--root", str(WORK / f"hub-{port}"), "--port", str(port),
                               "--token", token, "--token", other, "--user", user],
                              stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        report = WORK / "report.xml"
        env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HUB_DISABLE_XET="1",
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_CACHE=str(WORK / "cache"))
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-o", "addopts=", "-m", "not production", f"--junitxml={report}",
                        *[str(tests / m) for m in MODULES if (tests / m).exists()]],
                       check=False, cwd=tests.parent, env=env)
    finally:
        server.terminate()
        server.wait()
    return _compare(report, args.update_list)


def _sources(version: str) -> Path:
    folder = WORK / f"huggingface_hub-{version}"
    if not (folder / "tests").is_dir():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", ":all:", "--dest", str(WORK),
                        f"huggingface_hub=={version}"], check=True)
        with tarfile.open(WORK / f"huggingface_hub-{version}.tar.gz") as archive:
            archive.extractall(WORK, filter="data")
    tests = folder / "tests"
    constants = tests / "testing_constants.py"
    text = constants.read_text()
    constants.write_text(re.sub(r'^ENDPOINT_STAGING = .*$',
                                'ENDPOINT_STAGING = __import__("os").environ["HF_ENDPOINT"]',
                                text, flags=re.MULTILINE))
    (tests / "__init__.py").touch()
    (tests / "conftest.py").write_text(CONFTEST)
    return tests


#: Why a failing test is out of scope, by what its failure says (first match wins); anything
#: else is listed as a known gap with its message, to fix and remove from the list.
REASONS = (
    (r"Pull requests are not supported|create_pr|_on_pr\b|refs/pr/",
     "pull requests: refused by design (a typed 400; never lands on main)"),
    (r"[Dd]iscussion", "discussions: not served"),
    (r"webhook", "webhooks: not served"),
    (r"/api/collections", "collections: not served"),
    (r"/likes|[Aa]ctivity", "likes and activity: not served"),
    (r"Name or service not known|production", "needs the production Hub"),
    (r"[Gg]ated|access.?request", "gated repos and access requests: not served"),
    (r"/api/(models|datasets|spaces)\?", "search and listing: not served"),
    (r"auth-check|auth_check", "auth-check route: not served"),
    (r"[Ss]quash|permanently|verify_repo_checksums|LFS files",
     "history squashing and LFS file management: not served"),
    (r"private_by_default|visibility", "organisation defaults (private by default): not served"),
)


def _reason(test_id: str, message: str) -> str:
    text = f"{test_id} {message}"
    for pattern, reason in REASONS:
        if re.search(pattern, text):
            return reason
    first = " ".join(message.split())[:110]
    return f"known gap: {first}"


def _compare(report: Path, update: bool) -> int:
    tree = ElementTree.parse(report)
    failed, passed, messages = set(), set(), {}
    for case in tree.iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            failed.add(test_id)
            messages[test_id] = problem.get("message") or ""
        elif case.find("skipped") is None:
            passed.add(test_id)
    listed = {}
    if LIST.exists():
        for line in LIST.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                test_id, _, reason = line.partition("  # ")
                listed[test_id.strip()] = reason.strip()
    if update:
        LIST.write_text("# huggingface_hub tests that fail against the local endpoint, with the "
                        "reason (out of scope, or a known gap to fix)\n"
                        + "".join(f"{t}  # {listed.get(t) or _reason(t, messages[t])}\n"
                                  for t in sorted(failed)))
    unexpected = sorted(failed - set(listed))
    fixed = sorted(set(listed) & passed)
    print(f"huggingface_hub's tests against the local endpoint: {len(passed)} passed, "
          f"{len(failed)} failed ({len(failed & set(listed))} of them listed as out of scope)")
    for test_id in unexpected:
        print(f"  unexpected failure: {test_id}")
    for test_id in fixed:
        print(f"  now passes, remove it from the list: {test_id}")
    return 1 if (unexpected or fixed) and not update else 0



if __name__ == "__main__":
    sys.exit(main())
