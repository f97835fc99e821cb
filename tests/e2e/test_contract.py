"""The CLI's contract, swept over every command: with ``--json`` every outcome is exactly one
JSON object on stdout with ``ok`` (and on failure ``error: {type, message, exit_code}``, the
exit code); malformed ids, revisions and tag names exit 2 before any work; the fixes a refusal
suggests work when run as suggested; a re-pack keeps the recorded pin. Real CLI processes
against a local endpoint, except in the chains of fixes (``chain``: the CLI's entry point in
this process, with the environment a process would have), whose subject is the advice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

import cubepack
from cubepack._util import constants
from cubepack.cli import cli as click_group
from cubepack.testing.hub import upload_folder

from envs import chain_once
from helpers import as_format_1, cli_in_process, copy_of, make_key


@pytest.fixture
def run(hub, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "user-cache"),
               HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_XET="1")

    def cubepack_cli(*args, timeout=300):
        done = subprocess.run([sys.executable, "-m", "cubepack", *map(str, args)], env=env,
                              cwd=work, capture_output=True, text=True, timeout=timeout, check=False)
        return done
    cubepack_cli.work = work
    cubepack_cli.env = env
    return cubepack_cli


@pytest.fixture
def chain(run):
    """``run``'s commands (its environment and folder) through the CLI's entry point in this
    process: for chains of commands, where loading torch and transformers in a new process per
    step would be most of the test's time."""
    def cubepack_in_process(*args):
        return cli_in_process(args, env=run.env, cwd=run.work)
    cubepack_in_process.work = run.work
    return cubepack_in_process


def one_json(done) -> dict:
    """stdout is exactly one JSON object carrying ``ok``; its error (if any) is the exit code."""
    data = json.loads(done.stdout)  # raises on anything but one JSON document
    assert isinstance(data, dict) and isinstance(data["ok"], bool), done.stdout
    if data["ok"]:
        assert done.returncode == 0, done.stderr
    else:
        assert set(data["error"]) == {"type", "message", "exit_code"}
        assert data["error"]["exit_code"] == done.returncode != 0
        assert data["error"]["message"]
    return data


def all_commands(group=click_group, prefix=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from all_commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


# --- one output contract, every command ---------------------------------------------------------

FAILURES = {  # (args, expected error type): a refusal, a usage error or a Hub error per command
    ("fingerprint",): [(["./missing"], "ModelNotFoundError")],
    ("inspect",): [(["{text}"], "FormatError"), (["{pickle}"], "FormatError")],
    ("pack",): [(["/nonexistent"], "UsageError"), (["{empty}"], "UsageError"),
                (["{cube}", "--adapter-base", "ns/base"], "UsageError")],
    ("verify",): [(["/nonexistent"], "UsageError"), (["{tampered}"], "VerificationFailed"),
                  (["{cube}", "--embedder", "x"], "VerificationFailed"),
                  (["{cube}", "--embedder-sample", "3"], "UsageError"),
                  (["{cube}", "--require-lineage"], "UsageError"),
                  (["{cube}", "--require-lineage", "--trusted-key", "{public}"],
                   "VerificationFailed")],
    ("diff",): [(["{cube}", "/nonexistent"], "UsageError")],
    ("migrate",): [(["{cube}", "--out", "new"], "UsageError"),
                   (["{cube}", "--model", "{model}", "--out", "{cube}/inside"], "UsageError"),
                   (["{tampered}", "--model", "{model}", "--out", "new"], "VerificationFailed")],
    ("lineage",): [(["{empty}"], "FormatError"), (["{cube}", "--timeout", "0"], "UsageError")],
    ("import", "llamacpp"): [(["{text}", "--gguf", "{text}", "--model", "x"], "FormatError")],
    ("export", "llamacpp"): [(["{text}", "--out", "x.state"], "FormatError")],
    ("upgrade",): [(["{cube}"], "UsageError")],
    ("import", "mlx"): [(["{pickle}", "--model", "./missing"], "FormatError"),
                        (["{text}", "--model", "x", "--token-ids", "[1,"], "UsageError")],
    ("export", "mlx"): [(["{text}", "--out", "x.safetensors"], "FormatError")],
    ("sign",): [(["{tampered}", "--key", "{key}"], "VerificationFailed")],
    ("compact",): [(["{empty}"], "UsageError")],
    ("encrypt",): [(["{cube}", "--to", "nonsense"], "UsageError"),
                   (["{tampered}", "--to", "{recipient}"], "VerificationFailed")],
    ("rekey",): [(["{cube}", "--add", "{recipient}"], "UsageError")],
    ("push",): [(["{cube}", "not a repo"], "UsageError"),
                (["{cube}", "ns/x", "--tag", "x y"], "UsageError"),
                (["{cube}", "ns/x", "--revision", "../x"], "UsageError"),
                (["{cube}", "ns/x", "--tag", "refs/pr/1"], "UsageError")],
    ("pull",): [(["ns/x@../x"], "UsageError"), (["ns/x@"], "UsageError"),
                (["ns/x@ABCDEF0123456789ABCDEF0123456789ABCDEF01"], "UsageError"),
                (["ns/x@refs/pr/0"], "UsageError"), (["ns/x@refs/pr/01"], "UsageError"),
                (["ns/absent", "--local-dir", "t"], "HubError"),
                (["ns/x", "--embedder-sample", "3"], "UsageError"),
                (["ns/x", "--require-lineage"], "UsageError")],
    ("hub", "serve"): [(["--port", "{busy}", "--root", "r"], "UsageError")],
    ("hub", "gc"): [(["{empty}"], "UsageError")],
    ("search",): [(["--model", "./missing"], "UsageError"),
                  (["--model", "sha256:" + "0" * 64, "--trusted-key", "{text}"], "UsageError")],
}


def _age_key(folder):
    """(identity file, mode 600; its recipient) of a new age X25519 key."""
    import pyrage

    identity = pyrage.x25519.Identity.generate()
    path = folder / "reader.key"
    path.write_text(f"{identity}\n")
    path.chmod(0o600)
    return path, str(identity.to_public())


@pytest.fixture
def inputs(cube, zoo, tmp_path):
    import pickle
    import socket

    (tmp_path / "text.txt").write_text("root:x:0:0:root:/root:/bin/bash\n" * 4)
    (tmp_path / "data.pickle").write_bytes(pickle.dumps({"a": 1}))
    (tmp_path / "empty").mkdir()
    tampered = copy_of(cube, tmp_path / "tampered")
    kv = next((tampered / "activations").glob("*.kv.safetensors"))
    data = bytearray(kv.read_bytes())
    data[-1] ^= 1
    kv.write_bytes(bytes(data))
    key, public = make_key(tmp_path, "signer")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    yield {"text": tmp_path / "text.txt", "pickle": tmp_path / "data.pickle",
           "empty": tmp_path / "empty", "tampered": tampered, "cube": cube, "key": key,
           "public": public, "recipient": _age_key(tmp_path)[1],
           "busy": busy.getsockname()[1], "model": zoo["b"]}
    busy.close()


def test_the_sweep_covers_every_command():
    assert sorted(all_commands()) == sorted(FAILURES)


@pytest.mark.parametrize("command", sorted(FAILURES), ids=" ".join)
def test_every_failure_of_every_command_is_one_json_object(command, run, inputs, hub):
    for args, kind in FAILURES[command]:
        before = sum(hub.stats.requests.values())
        done = run(*command, *[arg.format(**inputs) for arg in args], "--json")
        data = one_json(done)
        assert data["ok"] is False and data["error"]["type"] == kind, (args, done.stdout)
        assert "Traceback" not in done.stderr
        if kind == "UsageError":
            assert data["error"]["exit_code"] == 2
            assert sum(hub.stats.requests.values()) == before, f"{args}: a usage error did work first"


def test_inspect_says_what_a_file_is_when_it_is_not_a_kv_file(run, inputs):
    text = one_json(run("inspect", inputs["text"], "--json"))["error"]["message"]
    assert "starts with text" in text and "byte header" not in text
    pickled = one_json(run("inspect", inputs["pickle"], "--json"))["error"]["message"]
    assert "a pickle (protocol" in pickled and "cubepack pack --legacy-pickle" in pickled
    import pickle

    for protocol in (0, 1):  # MemOS never writes these, but old tools do
        old = inputs["pickle"].with_name(f"old-{protocol}.pickle")
        old.write_bytes(pickle.dumps({"a": [1]}, protocol=protocol))
        message = one_json(run("inspect", old, "--json"))["error"]["message"]
        assert "a pickle (protocol 0 or 1)" in message


@pytest.mark.parametrize("data, says", [
    (b"\x1f\x8b\x08\x00" + bytes(40), "a gzip stream"),
    (b"\x93NUMPY\x01\x00" + bytes(40), "a NumPy .npy array"),
    ("hello world".encode("utf-16"), "UTF-16 text"),
    (bytes(range(200, 256)), "its first 8 bytes would claim"),  # random: no format
])
def test_inspect_names_other_binary_formats_too(tmp_path, data, says):
    """Not only pickles, zips, JSON and text: no file's first bytes are called a header length
    'above the limit' when they cannot be one (the file is smaller than they claim)."""
    path = tmp_path / "x.kv.safetensors"
    path.write_bytes(data)
    with pytest.raises(cubepack.FormatError, match="is not a safetensors") as caught:
        cubepack.read_kv_header(path)
    assert says in str(caught.value) and "byte header" not in str(caught.value)


@chain_once
def test_every_command_succeeds_with_one_json_object(chain, cube, zoo, tmp_path, hub, capfd):
    """Each command's success, through the CLI's entry point in this process (its failures,
    above, each run as a real process): its stdout is one JSON object, and nothing else
    reached the process's file descriptors 1 and 2 (a library writing past Python)."""
    def run(*args):
        done = chain(*args)
        leaked = capfd.readouterr()
        assert leaked.out == "" and "\r" not in leaked.err, (args, leaked)
        return done

    kv = next((cube / "activations").glob("*.kv.safetensors"))
    key, public = make_key(tmp_path, "signer")
    assert one_json(run("fingerprint", zoo["a"], "--json"))["weights_digest"]
    assert one_json(run("inspect", kv, "--json"))["version"] == constants.KV_FORMAT_VERSION
    assert one_json(run("pack", cube, "--json"))["activations"]
    assert one_json(run("verify", cube, "--json"))["checks"]
    assert one_json(run("compact", cube, "--json"))["changed"] is False  # no shards
    assert one_json(run("diff", cube, cube, "--json"))["same"] is True
    old = tmp_path / "old.kv.safetensors"
    as_format_1(kv, old, zoo["a"] / "tokenizer.json")
    assert one_json(run("upgrade", old, "--model", zoo["a"], "--json"))["ok"] is True
    assert one_json(run("sign", cube, "--key", key, "--json"))["ok"] is True
    attested = one_json(run("verify", cube, "--trusted-key", public, "--require-lineage",
                            "--json"))
    assert attested["attested_by"] == str(public)
    migrated = one_json(run("migrate", cube, "--model", zoo["b"], "--out", tmp_path / "migrated",
                            "--json"))
    assert migrated["retokenized"] == ["item-1", "item-2"]
    shown = one_json(run("lineage", tmp_path / "migrated", "--json"))
    assert shown["chain"][0]["parent"]["lock_digest"] == migrated["lineage"]["parent"]["lock_digest"]
    exported = one_json(run("export", "mlx", kv, "--out", tmp_path / "p.safetensors", "--json"))
    imported = one_json(run("import", "mlx", exported["path"], "--model", zoo["a"], "--out",
                            tmp_path / "back.kv.safetensors", "--json"))
    assert imported["token_count"] == cubepack.read_kv_header(kv).token_count
    private = copy_of(cube, tmp_path / "private")
    reader, recipient = _age_key(tmp_path)
    assert one_json(run("encrypt", private, "--to", recipient, "--json"))["ciphertexts"]
    (tmp_path / "second").mkdir()
    _, other = _age_key(tmp_path / "second")
    # Unsigned: rekey takes the recipients from the user (--to), never from the cube.
    rekeyed = one_json(run("rekey", private, "--to", recipient, "--to", other, "--identity",
                           reader, "--json"))
    assert rekeyed["added"] == [other] and rekeyed["generation"] == 2
    pushed = one_json(run("push", cube, "ns/cube", "--allow-local-paths", "--json"))
    pulled = one_json(run("pull", f"ns/cube@{pushed['commit_sha']}", "--local-dir",
                          tmp_path / "pulled", "--trusted-key", public, "--json"))
    assert pulled["commit_sha"] == pushed["commit_sha"] and pulled["verified"] is True
    server = subprocess.Popen([sys.executable, "-m", "cubepack", "hub", "serve", "--port", "0",
                               "--root", tmp_path / "served", "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [server.stdout.readline()]
        while lines[-1] and lines[-1] != "}\n":  # the object, indented, ends with "}"
            lines.append(server.stdout.readline())
        served = json.loads("".join(lines))
        assert served["ok"] is True and served["url"].startswith("http://127.0.0.1:")
    finally:
        server.terminate()
        server.wait()


def test_a_real_process_prints_one_json_object_on_success(run, cube, zoo, tmp_path):
    """The in-process sweep above cannot see what a process prints outside ``main`` (at import,
    from an exit handler, through a log handler bound to the real stdout): commands that load
    no model, each in its own process, as a user's script runs them."""
    assert one_json(run("fingerprint", zoo["a"], "--json"))["weights_digest"]
    assert one_json(run("verify", cube, "--json"))["checks"]
    pushed = one_json(run("push", cube, "ns/real", "--allow-local-paths", "--json"))
    pulled = one_json(run("pull", f"ns/real@{pushed['commit_sha']}", "--local-dir",
                          tmp_path / "pulled", "--json"))
    assert pulled["commit_sha"] == pushed["commit_sha"] and pulled["verified"] is True


# --- failed means unchanged ---------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["ns/x@../x", "ns/x@", "ns/x@HEAD", "ns/x@a//b", "ns/x@x.lock"])
def test_a_pull_with_a_bad_ref_places_nothing(run, spec, hub):
    before = sum(hub.stats.requests.values())
    done = run("pull", spec, "--local-dir", "target")
    assert done.returncode == 2, done.stderr
    assert not (run.work / "target").exists() and sum(hub.stats.requests.values()) == before


# --- the fixes refusals suggest work, run as suggested ------------------------------------------

@chain_once
def test_a_local_model_path_refused_at_push_is_fixed_by_the_pack_it_suggests(chain, cube, zoo,
                                                                             hub):
    upload_folder(hub.url, "ns/model-a", zoo["a"])
    done = chain("push", cube, "ns/cube")
    assert done.returncode == 2 and "--model OWNER/MODEL" in done.stderr
    assert chain("pack", cube, "--model", "ns/model-a").returncode == 0
    config = json.loads((cube / "config.json").read_text())
    assert config["act_mem"]["config"]["extractor_llm"]["config"][
        "model_name_or_path"] == "ns/model-a"
    again = chain("push", cube, "ns/cube")
    assert again.returncode == 0, again.stderr


@chain_once
def test_an_unpacked_memos_cube_refused_at_verify_is_fixed_by_the_pack_it_suggests(
        chain, zoo, models, tmp_path):
    import torch

    from helpers import build_cache
    from memos_format import write_cube

    folder = write_cube(tmp_path / "plain", str(zoo["a"]),
                        {"item": build_cache(models["a"], torch.tensor([[5, 6, 7, 8]]))})
    done = chain("verify", folder)
    assert done.returncode != 0
    suggestion = "cubepack pack"
    assert suggestion in done.stdout + done.stderr
    assert chain("pack", folder, "--legacy-pickle").returncode == 0
    assert chain("verify", folder).returncode == 0


@chain_once
def test_require_provenance_refusal_is_fixed_by_what_it_suggests(chain, zoo, models, tmp_path):
    """A MemOS pickle (no token ids) of a cache MemOS's own chat-template prefill made: the
    refusals lead, run as printed, to re-packing with --recompute and verifying with it."""
    import torch
    from transformers import AutoTokenizer

    from cubepack.memos_format._layout import memos_prompt_ids

    from helpers import build_cache
    from memos_format import write_cube

    text = "The user likes green tea."
    ids = memos_prompt_ids(AutoTokenizer.from_pretrained(zoo["a"]), text)
    cube = write_cube(tmp_path / "memos", str(zoo["a"]),
                      {"tea": build_cache(models["a"], torch.tensor([ids]))}, texts={"tea": text})
    assert chain("pack", cube, "--legacy-pickle").returncode == 0
    done = chain("verify", cube, "--require-provenance", "recomputed")
    assert done.returncode == 1
    suggested = f"cubepack verify {cube} --recompute --model MODEL --require-provenance recomputed"
    assert suggested in done.stdout
    again = chain(*suggested.replace("MODEL", str(zoo["a"])).split()[1:])
    if again.returncode:  # an activation without token ids: the refusal says to re-pack first
        repack = "cubepack pack CUBE --recompute --model MODEL"
        assert repack in again.stdout
        fix = repack.replace("CUBE", str(cube)).replace("MODEL", str(zoo["a"]))
        done = chain(*fix.split()[1:])
        assert done.returncode == 0, done.stderr
        again = chain(*suggested.replace("MODEL", str(zoo["a"])).split()[1:])
    assert again.returncode == 0, again.stdout[-2000:]


@chain_once
def test_a_text_export_without_config_is_packed_as_suggested(chain, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "notes.md").write_text("What the team knows.\n")
    (export / "textual_memory.json").write_text(json.dumps({"nodes": [], "edges": []}))
    done = chain("pack", export)
    assert done.returncode == 2 and "--cube-id OWNER/NAME" in done.stderr
    assert chain("pack", export, "--cube-id", "ns/notes").returncode == 0
    assert chain("verify", export).returncode == 0


# --- pins are remembered ------------------------------------------------------------------------

def a_new_commit_of_model_a(hub, zoo, tmp_path):
    """Model A's files plus a note, pushed to ns/model-a's main: its new commit id."""
    moved = tmp_path / "model-a-moved"
    shutil.copytree(zoo["a"], moved)
    (moved / "NOTES.md").write_text("a new commit on main\n")
    return upload_folder(hub.url, "ns/model-a", moved)


@chain_once
def test_a_repack_keeps_the_pin_and_a_changed_name_needs_model_again(chain, cube, zoo, hub,
                                                                     tmp_path):
    first = upload_folder(hub.url, "ns/model-a", zoo["a"])
    assert chain("pack", cube, "--model", "ns/model-a").returncode == 0
    second = a_new_commit_of_model_a(hub, zoo, tmp_path)
    assert second != first
    key, _ = make_key(tmp_path, "signer")
    signed = chain("pack", cube, "--sign-key", key)  # signing changes no pin
    assert signed.returncode == 0 and "moved" not in signed.stdout
    pins = yaml.safe_load((cube / "cubepack.yaml").read_text())["models"]
    assert pins["act_mem"]["repo_id"] == "ns/model-a" and pins["act_mem"]["revision"] == first
    config = json.loads((cube / "config.json").read_text())
    config["act_mem"]["config"]["extractor_llm"]["config"]["model_name_or_path"] = "ns/model-b"
    (cube / "config.json").write_text(json.dumps(config))
    done = chain("pack", cube)
    assert done.returncode == 2
    assert f"ns/model-a@{first}" in done.stderr and "--model ns/model-b" in done.stderr
    assert cubepack.verify(cube, raise_on_failure=False).ok is False  # unchanged: still edited
    config["act_mem"]["config"]["extractor_llm"]["config"]["model_name_or_path"] = "ns/model-a"
    (cube / "config.json").write_text(json.dumps(config))
    moved = chain("pack", cube, "--model", "ns/model-a")  # asked for: main, now the new commit
    assert moved.returncode == 0 and f"@{second} (moved: was ns/model-a@{first})" in moved.stdout


@chain_once
def test_a_revision_alone_moves_the_pin_and_a_folder_refuses_one(chain, cube, zoo, hub,
                                                                 tmp_path):
    """``pack --revision R`` without --model re-pins the recorded model at R (it kept the old
    pin, silently); a producer named by a plain folder has no revision to pick: exit 2."""
    before = (cube / "cubepack.lock").read_bytes()
    done = chain("pack", cube, "--revision", "main", "--json")
    assert one_json(done)["error"]["type"] == "UsageError" and "--revision" in done.stdout
    assert (cube / "cubepack.lock").read_bytes() == before
    first = upload_folder(hub.url, "ns/model-a", zoo["a"])
    assert chain("pack", cube, "--model", "ns/model-a").returncode == 0
    second = a_new_commit_of_model_a(hub, zoo, tmp_path)

    def pinned():
        return yaml.safe_load((cube / "cubepack.yaml").read_text())["models"]["act_mem"]["revision"]

    assert chain("pack", cube, "--revision", "main").returncode == 0 and pinned() == second
    assert chain("pack", cube).returncode == 0 and pinned() == second  # remembered again
    assert chain("pack", cube, "--revision", first).returncode == 0 and pinned() == first


def test_json_mode_is_what_click_parsed_not_a_word_on_the_line(run, tmp_path):
    """``--json`` as the value of another option is that option's value: a refusal is then
    text, not JSON; the flag itself still gives JSON."""
    unpacked = tmp_path / "not-a-cube"
    unpacked.mkdir()
    done = run("push", unpacked, "user/repo", "--commit-message", "--json")
    assert done.returncode == 1 and "error:" in done.stderr
    assert not done.stdout.lstrip().startswith("{"), done.stdout
    assert one_json(run("push", unpacked, "user/repo", "--commit-message", "m", "--json"))[
        "error"]["exit_code"] == 1
