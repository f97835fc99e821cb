"""Run huggingface_hub's own test suite against ``cubepack hub serve`` (``make hub-compat``).

1. downloads the sdist of the *installed* huggingface_hub version from the package registry
   (the tests ship in it) into ``.cache/hub-compat/``;
2. points its staging endpoint at a local ``cubepack hub serve`` started with the suite's
   tokens and user, and adds the small ``conftest.py`` the sdist lacks;
3. runs the repo, commit, download, refs, file-system, commit-scheduler, copy, cache-layout
   and upload-pipeline tests (``-m "not production"``) with Xet off, the ``xet``-marked ones
   included (they run on plain LFS when Xet is off), through fixtures that do what the suite's
   own conftest does: a session ``api`` on the staging endpoint, a ``repo_factory`` that
   deletes what it created, a fresh cache folder per test;
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
           "test_cache_layout.py", "test_upload_pipeline.py")
CONFTEST = '''
"""The fixtures of huggingface_hub's own conftest (not shipped in the sdist) that these tests use,
pointed at the staging endpoint; Xet stays off, so xet-marked tests run on plain LFS."""
import os
from typing import Protocol

import pytest
from huggingface_hub import HfApi, RepoUrl, constants
from huggingface_hub.utils import SoftTemporaryDirectory

from .testing_constants import ENDPOINT_STAGING, TOKEN
from .testing_utils import repo_name


@pytest.fixture(autouse=True)
def patch_constants(mocker):
    with SoftTemporaryDirectory() as cache_dir:
        for name, sub in (("HF_HOME", ""), ("HF_HUB_CACHE", "hub"), ("HF_XET_CACHE", "xet"),
                          ("HUGGINGFACE_HUB_CACHE", "hub"), ("HF_ASSETS_CACHE", "assets"),
                          ("HF_TOKEN_PATH", "token"), ("HF_STORED_TOKENS_PATH", "stored_tokens")):
            if hasattr(constants, name):
                mocker.patch.object(constants, name, os.path.join(cache_dir, sub))
        yield


@pytest.fixture(autouse=True)
def xet_off(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


@pytest.fixture(autouse=True)
def disable_experimental_warnings(monkeypatch):
    if hasattr(constants, "HF_HUB_DISABLE_EXPERIMENTAL_WARNING"):
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_EXPERIMENTAL_WARNING", True)


@pytest.fixture(scope="session")
def api():
    return HfApi(endpoint=ENDPOINT_STAGING, token=TOKEN)


class RepoFactory(Protocol):
    """The type the tests annotate ``repo_factory`` with."""

    def __call__(self, repo_type: str = "model", **kwargs) -> RepoUrl: ...


@pytest.fixture
def repo_factory(api):
    created = []

    def factory(repo_type="model", repo_id=None, **kwargs):
        name = repo_id or repo_name(prefix=repo_type)  # a test's own id is taken as it is
        url = api.create_repo(repo_id=name, repo_type=repo_type, **kwargs)
        created.append((url.repo_id, repo_type))
        return url

    yield factory
    for repo_id, repo_type in created:
        try:
            api.delete_repo(repo_id=repo_id, repo_type=repo_type)
        except Exception:
            pass


@pytest.fixture
def api_prod():
    pytest.skip("production Hub")
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


#: Why a failing test is out of scope, by its id (first match wins): a message can mislead (the
#: client's every 404 says "If you are trying to access a private or gated repo"). Anything else
#: is listed as a known gap with its message, to fix and remove from the list.
REASONS = (
    (r"TestWebhookApi", "webhooks: not served"),
    (r"TestCollectionAPI", "collections: not served"),
    (r"TestAccessRequestAPI|gated|test_update_(dataset_)?repo_settings",
     "gated repos and access requests: not served (a gated setting is refused with 422)"),
    (r"TestActivityApi|likes", "likes and activity: not served"),
    (r"[Ss]quash", "history squashing (super_squash_history): not served"),
    (r"lfs_files", "listing and permanently deleting a repo's LFS files: not served"),
    (r"inference_catalog", "needs the production Hub"),
    (r"private_by_default", "organisation defaults (an Enterprise org whose repos are private "
                            "by default): not served"),
    (r"whoami_with_passing_token", "the staging account's profile (its full name): the "
                                   "endpoint's account has only --user"),
    (r"modelcard", "model card metadata validation on commit (the Hub checks README.md's "
                   "YAML): not served"),
    (r"test_create_commit_repo_does_not_exist", "the error's words: the endpoint's message "
                                                "names the repo, where the Hub's is the bare "
                                                "'Repository Not Found' the client folds away"),
    (r"test_copy_files::test_cp_", "buckets: not served"),
    (r"xet|test_copy_files_repo_to_repo", "Xet storage: not served (the test needs Xet hashes "
                                          "or a Xet download)"),
)


def _reason(test_id: str, message: str) -> str:
    for pattern, reason in REASONS:
        if re.search(pattern, test_id):
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
