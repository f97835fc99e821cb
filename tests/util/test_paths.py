"""Path safety: the one rule for every path inside a cube."""

from __future__ import annotations

import os
import re

import pytest

from cubepack import UnsafeInputError
from cubepack._util.paths import (
    check_no_collisions,
    check_relpath,
    list_cube_files,
    regular_file,
    scan_cube,
)

from data import COLLIDING_NAMES, UNPORTABLE_NAMES
from envs import once

pytestmark = once

SHA = "ab" * 32


@pytest.mark.parametrize("name", ["a.json", "activations/x.kv.safetensors", "a b/c-d_e.txt",
                                  "auxiliary.txt", "con_fig.json", "com10.txt", "nul-x.md",
                                  ".gitattributes", "a..b.txt", "caf\u00e9.txt"])
def test_safe_relative_paths_pass(name):
    assert check_relpath(name) == name


@pytest.mark.parametrize("name, message", [
    ("", "non-empty"), ("/etc/passwd", "absolute"), ("C:/x", "absolute"), ("a/../b", "'..'"),
    ("a//b", "empty"), ("./a", "'.'"), ("a\\b", "backslash"), ("a\nb", "control"),
    ("cafe\u0301", "NFC"), ("x" * 1025, "longer than"), (7, "non-empty string"),
])
def test_unsafe_paths_are_refused(name, message):
    with pytest.raises(UnsafeInputError, match=message):
        check_relpath(name)


@pytest.mark.parametrize("name, rule", UNPORTABLE_NAMES)
def test_names_some_file_system_cannot_hold_are_refused_naming_path_and_rule(name, rule):
    with pytest.raises(UnsafeInputError, match=re.escape(repr(name)) + ".*" + re.escape(rule)):
        check_relpath(name)


@pytest.mark.parametrize("first, second", COLLIDING_NAMES)
def test_case_and_unicode_collisions_are_refused(first, second):
    check_no_collisions(["a.txt", "b.txt", "docs/a.txt", "docs/b.txt"])
    with pytest.raises(UnsafeInputError, match="collide|both a file and a folder") as caught:
        check_no_collisions([first, second])
    assert repr(first.split("/")[0]) in str(caught.value)


def test_scan_reports_links_and_special_files_without_following_them(tmp_path):
    import os

    (tmp_path / "ok.txt").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inner.txt").write_text("y")
    os.symlink("/etc", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    files, problems = scan_cube(tmp_path)
    assert files == ["dir/inner.txt", "ok.txt"]
    assert sorted(where for where, _ in problems) == ["fifo", "link"]
    with pytest.raises(UnsafeInputError):
        list_cube_files(tmp_path)


def test_regular_file_never_leads_through_a_symlink(tmp_path):
    import os

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    root = tmp_path / "root"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "ok.txt").write_text("x")
    os.symlink(outside, root / "linked")
    os.symlink(outside / "secret.txt", root / "dir" / "file-link.txt")
    assert regular_file(root, "dir/ok.txt") == root / "dir" / "ok.txt"
    for name, what in (("linked/secret.txt", "folder"), ("dir/file-link.txt", "file"),
                       ("dir", "file")):
        with pytest.raises(UnsafeInputError, match=f"symlink or not a regular {what}"):
            regular_file(root, name)
    with pytest.raises(UnsafeInputError, match="'..' segment"):
        regular_file(root, "../outside/secret.txt")


@pytest.mark.parametrize("name, rule", UNPORTABLE_NAMES + [("a/../b.txt", "escape the cube")])
def test_a_path_refusal_names_the_path_once_and_says_what_to_do(tmp_path, name, rule):
    """The rule's own message ("Path 'x' ...; rename it.") and, in a list that names each path
    itself (a cube's scan), its reason alone: the name never twice, no '..' ending."""
    from cubepack._util.paths import check_relpath, list_cube_files

    with pytest.raises(UnsafeInputError) as caught:
        check_relpath(name)
    message = str(caught.value)
    assert rule in message and message.count(repr(name)) == 1, message
    assert message.endswith("; rename it.") and not message.endswith(".."), message
    if "/" in name or "\x1f" in name or name.endswith(" "):
        return  # not a name the file system here can hold as one file
    (tmp_path / name).write_text("x")
    with pytest.raises(UnsafeInputError) as caught:
        list_cube_files(tmp_path)
    message = str(caught.value)
    listed = re.sub(r"\(CON, .*?\)", "", message)  # the rule's own list names AUX too
    assert message.startswith(f"Path {name!r} ") and listed.count(name) == 1, message
    assert message.endswith("; rename it.") and not message.endswith(".."), message


def test_a_symlink_or_special_file_says_what_to_do(tmp_path):
    from cubepack._util.paths import scan_cube

    (tmp_path / "link").symlink_to("/etc/hostname")
    os.mkfifo(tmp_path / "pipe")
    _, problems = scan_cube(tmp_path)
    assert dict(problems) == {
        "link": "is a symlink; cubes may hold regular files only: replace it with a copy of the "
                "file it points to (cp -L), or remove it",
        "pipe": "is not a regular file (a device, FIFO or socket); remove it"}
