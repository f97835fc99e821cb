"""tools/setup_env.py, the environment builder behind ``make setup``: its pure parts (pip's
configuration as pip applies it, its translation for uv, reading both tools' plans, spotting a
CUDA download) and its choice between uv and pip. Nothing here builds an environment."""

from __future__ import annotations

import json
import sys

import pytest

from envs import once
from helpers import load_tool

pytestmark = once

setup_env = load_tool("setup_env")

#: ``pip config list`` as it reads on our machines (PIP_* variables appear as ``:env:``).
LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_pip_config_is_read_as_pip_install_applies_it():
    assert setup_env.parse_pip_config(LISTING) == {
        "cert": "/etc/ssl/certs/ca-certificates.crt",
        "default-timeout": "180",
        "disable-pip-version-check": "1",
        "find-links": "/opt/wheels",
        "constraint": "/etc/xdg/pip/constraints.txt",
        "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple"}


def test_pip_precedence_env_over_install_over_global_and_other_commands_ignored():
    listing = """\
:env:.index-url='https://env.example/simple'
download.index-url='https://download.example/simple'
global.index-url='https://global.example/simple'
global.find-links='/global'
install.find-links='/install'
install.no-index='false'
global.trusted-host="a.example b.example"
not a setting
global.=nameless
"""
    assert setup_env.parse_pip_config(listing) == {
        "index-url": "https://env.example/simple", "find-links": "/install",
        "no-index": "false", "trusted-host": "a.example b.example"}


def test_uv_is_handed_every_index_the_constraints_and_the_certificate():
    index, install, environment = setup_env.uv_settings(setup_env.parse_pip_config(LISTING))
    assert index == ["--extra-index-url", "file:///opt/pypi/simple",
                     "--extra-index-url", "file:///opt/pypi-more/simple",
                     "--find-links", "/opt/wheels",
                     "--index-strategy", "unsafe-best-match"]
    assert install == ["--constraint", "/etc/xdg/pip/constraints.txt"]
    assert environment == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
                           "UV_HTTP_TIMEOUT": "180"}


def test_uv_settings_for_the_other_pip_options():
    index, install, environment = setup_env.uv_settings({
        "index-url": "https://mirror.example/simple", "trusted-host": "mirror.example",
        "constraint": "/c1.txt /c2.txt /c1.txt", "no-index": "yes",
        "proxy": "http://proxy.example:3128", "timeout": "30", "default-timeout": "180",
        "client-cert": "/me.pem"})
    assert index == ["--index-url", "https://mirror.example/simple",
                     "--allow-insecure-host", "mirror.example", "--no-index"]
    assert install == ["--constraint", "/c1.txt", "--constraint", "/c2.txt"]  # each once
    assert environment == {"HTTP_PROXY": "http://proxy.example:3128",
                           "HTTPS_PROXY": "http://proxy.example:3128",
                           "UV_HTTP_TIMEOUT": "30", "SSL_CLIENT_CERT": "/me.pem"}


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("on", True),
                                             ("0", False), ("false", False), ("no", False)])
def test_no_index_is_a_boolean_as_pip_reads_it(value, expected):
    index, _, _ = setup_env.uv_settings({"no-index": value})
    assert ("--no-index" in index) is expected


def test_no_pip_configuration_gives_uv_nothing_extra():
    assert setup_env.uv_settings({}) == ([], [], {})


def test_uv_plan_is_read_from_its_dry_run():
    output = """\
Using Python 3.11.7 environment at: /tmp/v/latest
Resolved 16 packages in 148ms
Would download 1 package
Would install 2 packages
 + pytest-mock==3.17.0
 + torch==2.13.0+cpu
 - torch==2.12.0+cpu
"""
    assert setup_env.planned_by_uv(output) == ["pytest-mock==3.17.0", "torch==2.13.0+cpu"]


def test_pip_plan_is_read_from_its_report():
    report = json.dumps({"version": "1", "install": [
        {"metadata": {"name": "torch", "version": "2.13.0+cpu"}},
        {"metadata": {"name": "nvidia-cublas", "version": "13.1.1.3"}}]})
    assert setup_env.planned_by_pip(report) == ["torch==2.13.0+cpu", "nvidia-cublas==13.1.1.3"]
    assert setup_env.planned_by_pip("not json") == []


def test_a_cuda_plan_is_spotted():
    plan = ["filelock==3.20.0", "nvidia-cublas==13.1.1.3", "NVIDIA_NCCL_cu13==2.29.7",
            "cuda-bindings==13.5.0", "triton==3.7.1", "torch==2.13.0"]
    assert setup_env.cuda_packages(plan) == plan[1:5]
    assert setup_env.cuda_packages(["torch==2.13.0+cu130"]) == ["torch==2.13.0+cu130"]


def test_a_cpu_plan_passes():
    assert setup_env.cuda_packages(["torch==2.13.0+cpu", "tritonclient==2.0", "cudf-like==1",
                                    "transformers==5.24.0"]) == []


def test_uv_is_found_by_path_or_name_and_empty_means_pip(tmp_path, monkeypatch):
    assert setup_env.find_uv("") is None
    assert setup_env.find_uv(str(tmp_path / "missing" / "uv")) is None
    tool = tmp_path / "uv"
    tool.write_text("#!/bin/sh\n")
    assert setup_env.find_uv(str(tool)) is None  # not executable
    tool.chmod(0o755)
    assert setup_env.find_uv(str(tool)) == str(tool)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert setup_env.find_uv("uv") == str(tool)
    assert setup_env.find_uv("uv-of-nobody") is None


def test_without_uv_the_build_falls_back_to_pip_and_says_so(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(setup_env, "_with_pip", lambda *args: calls.append(args) or 0)
    monkeypatch.setattr(setup_env, "_with_uv", lambda *args: pytest.fail("uv was used"))
    venv = tmp_path / "env"
    status = setup_env.main(["--uv", str(tmp_path / "no-uv"), str(venv), "torch==2.13.0", "-e",
                             ".[test]"])
    assert status == 0
    assert calls == [(None, sys.executable, venv, ["torch==2.13.0", "-e", ".[test]"])]
    out = capsys.readouterr().out
    assert "is not available: building" in out and "ready in" in out and "(pip)" in out


def test_nothing_to_install_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        setup_env.main(["--uv", "", str(tmp_path / "env")])
    assert exit_info.value.code == 2
