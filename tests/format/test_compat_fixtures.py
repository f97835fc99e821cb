"""Compatible on purpose (#39 item 7): every artefact cubepack has written, in every format
version it still reads, is committed in ``tests/fixtures/compat/`` (written by the commit each
fixture's README names: ``tools/make_compat_fixtures.py``), and today's code reads each one as
its ``fixture.json`` says: the cube verifies (with its producer, its signer's key, its
embedder, its recipient's identity), its KV files load into their producer, its adapter onto its
base, a MemOS dump packs, the MemOS hook loads its activations (memos environment); or it is
refused naming the exact command that upgrades it, and that command, run on a copy, makes it
verify (``fixes``). What an older artefact no longer passes under a stronger option (a
version-1 attestation's lineage, a version-2 attestation's recomputed labels: claims now) is
refused naming its fix, which is run too (``refusals``). MLX-LM prompt caches are loaded by
MLX in ``tests/mlx/test_compat_mlx.py`` (the mlx environment); here only their layout is read.

The folder is swept: a new fixture is tested without editing this file, and a format version
the code reads with no fixture of it fails :func:`test_every_readable_version_has_a_fixture`.
The tiny models the fixtures pin are rebuilt, not committed: their digests are checked first
(:func:`test_the_rebuilt_tiny_models_are_the_ones_the_fixtures_pin`), so a change to
``cubepack.testing.tiny`` is named as such, not as twenty refusals.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

import cubepack
from cubepack._util import constants
from cubepack.format import _envelope
from cubepack.format import _lock as lockfile
from cubepack.kv._format import read_kv_header
from cubepack.trust import _age as age

from helpers import cli_in_process

COMPAT = Path(__file__).resolve().parents[1] / "fixtures" / "compat"
KEYS = COMPAT / "keys"
#: Every fixture: a folder holding a fixture.json (keys/ and files are not fixtures).
NAMES = sorted(p.name for p in COMPAT.iterdir() if (p / "fixture.json").is_file())
#: What a fixture may name as its artefact's folder.
ARTEFACTS = {"cube": "cube", "memos-dump": "cube", "kv": "kv", "mlx": "mlx"}
SIGNING = importlib.util.find_spec("model_signing") is not None
#: Placeholders a refusal's command holds for the path the refused step was given.
PLACEHOLDERS = {"path": ("CUBE_DIR", "CUBE", "PATH")}


def spec(name: str) -> dict:
    return json.loads((COMPAT / name / "fixture.json").read_text())


@pytest.fixture(scope="module")
def inputs(zoo, tmp_path_factory):
    """The models (rebuilt), the encoder, and the keys (copied: an identity file must be mode
    0600, which git does not keep)."""
    from cubepack.testing.embeddings import build_encoder

    root = tmp_path_factory.mktemp("compat-inputs")
    keys = root / "keys"
    shutil.copytree(KEYS, keys)
    for key in keys.iterdir():
        os.chmod(key, 0o600)
    return {"models": {"a": zoo["a"], "b": zoo["b"], "e": build_encoder(root / "e", seed=0)},
            "keys": {"trusted_key": keys / "signing.pub.pem", "sign": keys / "signing.pem",
                     "age": keys / "age.key",
                     "ssh": keys / "ssh_ed25519"}}


def at_home(cube: Path, model: Path) -> None:
    """A MemOS dump names its model by a folder of the machine that dumped it: point the
    copy's ``config.json`` at this machine's rebuild of that model (the same weights, pinned
    by digest in models.json), as a user who moves a MemOS cube does."""
    path = cube / "config.json"
    text = path.read_text()
    config = json.loads(text)
    named = {llm["config"]["model_name_or_path"] for llm in _llms(config)}
    for old in named:
        text = text.replace(json.dumps(old), json.dumps(str(model)))
    path.write_text(text)


def _llms(node):
    if isinstance(node, dict):
        if node.get("backend") in ("huggingface", "huggingface_singleton") and \
                isinstance(node.get("config"), dict) and "model_name_or_path" in node["config"]:
            yield node
        for value in node.values():
            yield from _llms(value)
    elif isinstance(node, list):
        for value in node:
            yield from _llms(value)


def options(fixture: dict, inputs: dict, asked: dict) -> dict:
    """The keyword arguments of verify for ``asked`` (a fixture's ``verify`` object)."""
    kwargs = {key: value for key, value in asked.items() if key != "trusted_key"}
    if asked.get("trusted_key"):
        kwargs["trusted_keys"] = [str(inputs["keys"]["trusted_key"])]
    if "model" in fixture:
        kwargs["model"] = str(inputs["models"][fixture["model"]])
    if "embedder" in fixture:
        kwargs["embedder"] = str(inputs["models"][fixture["embedder"]])
    if "identity" in fixture:
        kwargs["decrypt_with"] = str(inputs["keys"][fixture["identity"]])
    return kwargs


def artefact_copy(name: str, tmp_path: Path) -> Path:
    source = COMPAT / name / ARTEFACTS[spec(name)["artefact"]]
    copy = tmp_path / source.name
    tmp_path.mkdir(exist_ok=True)
    shutil.copytree(source, copy)
    return copy


def kv_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob(f"*{constants.KV_SUFFIX}"))


def run_fix(fix: dict, fixture: dict, inputs: dict, target: Path, model,
            tmp_path: Path) -> Path:
    """One refusal and its fix: the step (a verify under ``fix['verify']``, or a load) is
    refused naming ``fix['command']`` (as a template, or with the path it was given in place of
    ``CUBE_DIR``, ``CUBE`` or ``PATH``); that command, run with the placeholders filled (the
    artefact, its model, the parent fixture, a new folder, the signing key), succeeds; then the
    step passes on what it made (a ``cubepack verify`` fix is that step). Returns the artefact
    to go on with (``DIR`` when the command made one)."""
    if "verify" in fix:
        with pytest.raises(cubepack.VerificationFailed) as refused:
            cubepack.verify(target, **options(fixture, inputs, fix["verify"]))
        given = target
    else:
        given = kv_files(target)[0]
        with pytest.raises(cubepack.CubepackError) as refused:
            cubepack.load_kv_cache(given, model)
    words = fix["command"].split()
    shown = [fix["command"], *(" ".join(str(given) if word == placeholder else word
                                        for word in words)
                               for placeholder in PLACEHOLDERS["path"])]
    assert any(text in str(refused.value) for text in shown), (shown, str(refused.value))
    made = tmp_path / f"fixed-{len(list(tmp_path.glob('fixed-*')))}"
    values = {"MODEL": str(inputs["models"].get(fixture.get("model"), "")),
              "DIR": str(made), "KEY": str(inputs["keys"]["sign"]),
              **{placeholder: str(given) for placeholder in PLACEHOLDERS["path"]}}
    if "parent" in fix:
        values["PARENT"] = str(artefact_copy(fix["parent"], tmp_path / "parent"))
    assert words[0] == "cubepack"
    done = cli_in_process([values.get(word, word) for word in words[1:]], env=dict(os.environ),
                          cwd=tmp_path)
    assert done.returncode == 0, (fix["command"], done.stdout, done.stderr)
    target = made if "DIR" in words else target
    if words[1] == "verify":
        pass  # the command was the step, with what it lacked
    elif "verify" in fix:
        assert cubepack.verify(target, **options(fixture, inputs, fix["verify"])).ok
    else:
        assert cubepack.load_kv_cache(kv_files(target)[0], model).get_seq_length() > 0
    return target


def test_every_fixture_says_what_wrote_it_and_what_it_is():
    """A folder here is a fixture (fixture.json, a README naming its writer, its artefact),
    the test keys, or nothing else: a fixture without its spec would go untested."""
    assert NAMES, "no compatibility fixtures found"
    others = sorted(p.name for p in COMPAT.iterdir()
                    if p.name not in NAMES and p.name not in ("keys", "models.json", "README.md"))
    assert others == [], f"{others}: not fixtures (no fixture.json) in {COMPAT}"
    for name in NAMES:
        fixture = spec(name)
        commit = fixture["writer"]["commit"]
        assert len(commit) == 40 and set(commit) <= set("0123456789abcdef"), name
        assert fixture["artefact"] in ARTEFACTS, name
        assert (COMPAT / name / ARTEFACTS[fixture["artefact"]]).is_dir(), name
        readme = (COMPAT / name / "README.md").read_text()
        assert commit[:10] in readme and fixture["writer"]["how"] in readme, name


def test_the_rebuilt_tiny_models_are_the_ones_the_fixtures_pin(inputs):
    """The fixtures pin tiny models by digest; the tests rebuild them
    (cubepack.testing.tiny, seeded). Were tiny to change, every fixture would be refused:
    this names the cause once."""
    recorded = json.loads((COMPAT / "models.json").read_text())
    for name, pin in recorded.items():
        found = cubepack.fingerprint(str(inputs["models"][name]))
        assert (found.weights_digest, found.tokenizer_digest) == (
            pin["weights_digest"], pin["tokenizer_digest"]), (
            f"the tiny model {name!r} rebuilt by cubepack.testing.tiny is not the one the "
            "compatibility fixtures pin: tiny changed. Restore it (the fixtures of older "
            "commits cannot be rewritten).")


@pytest.mark.parametrize("name", NAMES)
def test_the_fixture_is_read_by_todays_code(name, inputs, models, tmp_path, caplog):
    fixture = spec(name)
    if fixture.get("signed") and not SIGNING:
        pytest.skip("a signed fixture: signatures need model_signing (cubepack[sign])")
    target = artefact_copy(name, tmp_path)
    model = models[fixture["model"]] if "model" in fixture else None
    for fix in fixture.get("fixes", []):  # refusals before it verifies, each with its fix
        target = run_fix(fix, fixture, inputs, target, model, tmp_path)
    if fixture["artefact"] == "mlx":  # MLX loads it: tests/mlx/test_compat_mlx.py
        from cubepack.mlx._convert import claimed_header
        from cubepack.mlx._layout import read_prompt_cache

        source = read_kv_header(next((COMPAT / fixture["source"] / "kv").iterdir()))
        for path in target.iterdir():  # without MLX: its layout, and the KV header it carries
            carried = claimed_header(read_prompt_cache(path))
            assert (carried.version, carried.producer) == (source.version, source.producer)
        return
    if fixture["artefact"] == "kv":
        for path in kv_files(target):
            check_kv_loads(path, fixture, inputs, model, caplog, tmp_path)
        return
    if fixture["artefact"] == "memos-dump":
        at_home(target, inputs["models"][fixture["model"]])
        cubepack.pack(target, model=str(inputs["models"][fixture["model"]]),
                      **fixture["pack"])
    report = cubepack.verify(target, **options(fixture, inputs, fixture["verify"]))
    assert report.ok
    if "basis" in fixture:  # what a signature backs, without this process recomputing
        signed = cubepack.verify(target, **options(fixture, inputs, {"trusted_key": True}))
        assert {entry["basis"] for entry in signed.provenance.values()} == {fixture["basis"]}
    if fixture.get("load"):
        check_loads(target, fixture, inputs, model, report)
    if "adapter" in fixture:
        from cubepack.testing import tiny

        base = tiny.load(inputs["models"][fixture["model"]])  # PEFT changes the model it wraps
        adapted = cubepack.load_adapter(base, target, fixture["adapter"])
        assert isinstance(adapted, pytest.importorskip("peft").PeftModel)
    for fix in fixture.get("refusals", []):  # what it passes no more, each with its fix
        target = run_fix(fix, fixture, inputs, target, model, tmp_path)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from cubepack.testing.hub import InstrumentedHub

    with InstrumentedHub(tmp_path_factory.mktemp("compat-hub")) as server:
        yield server


@pytest.mark.parametrize("name", [name for name in NAMES
                                  if spec(name)["artefact"] in ("cube", "memos-dump")])
def test_the_fixture_travels_through_a_hub(name, inputs, hub, tmp_path):
    """Pushed (as it is, or once fixed or packed as its spec says) to a local endpoint and
    pulled by the real huggingface_hub client, it verifies there as it did here."""
    fixture = spec(name)
    if fixture.get("signed") and not SIGNING:
        pytest.skip("a signed fixture: signatures need model_signing (cubepack[sign])")
    target = artefact_copy(name, tmp_path)
    for fix in fixture.get("fixes", []):
        target = run_fix(fix, fixture, inputs, target, None, tmp_path)
    if fixture["artefact"] == "memos-dump":
        at_home(target, inputs["models"][fixture["model"]])
        cubepack.pack(target, model=str(inputs["models"][fixture["model"]]), **fixture["pack"])
    # Fixtures name their tiny models by the local folder they were packed with.
    cubepack.push(target, f"compat/{name}", endpoint=hub.url, allow_local_paths=True)
    pulled = cubepack.pull(f"compat/{name}", endpoint=hub.url, local_dir=tmp_path / "pulled",
                           **options(fixture, inputs, fixture["verify"]))
    assert pulled.report.ok and len(pulled.commit_sha) == 40


def check_kv_loads(path: Path, fixture: dict, inputs: dict, model, caplog,
                   tmp_path: Path) -> None:
    """A lone KV file loads into its producer; a load that warns (a file without checksums
    loads unchecked) names the command that upgrades it, and, that command run, the file
    loads with no warning."""
    with caplog.at_level("WARNING", logger="cubepack"):
        caplog.clear()
        assert cubepack.load_kv_cache(path, model).get_seq_length() > 0
    warned = [record.getMessage() for record in caplog.records]
    if not warned:
        return
    command = f"cubepack upgrade {path} --model MODEL"
    assert any(command in message for message in warned), warned
    model_folder = str(inputs["models"][fixture["model"]])
    done = cli_in_process([model_folder if word == "MODEL" else word
                           for word in command.split()[1:]], env=dict(os.environ), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    with caplog.at_level("WARNING", logger="cubepack"):
        caplog.clear()
        assert cubepack.load_kv_cache(path, model).get_seq_length() > 0
    assert not caplog.records and read_kv_header(path).version == constants.KV_FORMAT_VERSION


def check_loads(target: Path, fixture: dict, inputs: dict, model, report) -> None:
    """Every activation of the cube loads into its producer (a private cube's from its
    ciphertext, with the identity)."""
    if "identity" not in fixture:
        entries = report.lock.activations
        assert entries
        for item, entry in entries.items():
            if entry.checksums is not None:  # a shard's range (lock version 6), by its item
                assert cubepack.load_kv_cache(target, model, item=item).get_seq_length() > 0
            else:
                assert cubepack.load_kv_cache(target / entry.file,
                                              model).get_seq_length() > 0
        return
    from cubepack.ops._private import open_private

    identity = inputs["keys"][fixture["identity"]]
    with open_private(target, identity) as opened:
        clear = {entry.file for entry in opened.lock.activations.values()}
        names = {clear_name: cipher for cipher, clear_name in opened.manifest["names"].items()}
    for name in sorted(clear):  # a whole KV file's ciphertext, decrypted whole
        cache = cubepack.load_kv_cache(target / names[name], model, decrypt_with=identity)
        assert cache.get_seq_length() > 0
    # Every memory by its item (a shard's range: its chunks; an older manifest: its file)
    items = report.private_lock.activations
    assert items and (clear or opened.lock.shards)
    for item in items:
        cache = cubepack.load_kv_cache(target, model, item=item, decrypt_with=identity)
        assert cache.get_seq_length() > 0


@pytest.mark.parametrize("name", [name for name in NAMES if spec(name).get("signed")
                                  and spec(name)["artefact"] == "cube"
                                  and "identity" not in spec(name)])
def test_a_signed_fixture_upgraded_is_signed_again_as_the_upgrade_says(name, inputs, tmp_path):
    """``cubepack upgrade`` (what a KV file of format 2 asks for at every load) re-packs an
    older signed cube, so the signature, which signed the old lock, cannot stay: the upgrade
    says so and names the command that signs it again, which, run, makes the cube verify as
    it did. A current cube is left as it is, signature and all."""
    if not SIGNING:
        pytest.skip("signatures need model_signing (cubepack[sign])")
    fixture = spec(name)
    target = artefact_copy(name, tmp_path)
    model = str(inputs["models"][fixture["model"]])
    signing = {name: (target / name).read_bytes() for name in
               (constants.SIGNATURE_FILENAME, constants.ATTESTATION_FILENAME)
               if (target / name).is_file()}
    done = cli_in_process(["upgrade", target, "--model", model], env=dict(os.environ),
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    if "upgraded 0 file(s)" in done.stdout:  # current (a compacted one signs its memories)
        assert signing and all((target / name).read_bytes() == data
                               for name, data in signing.items())
    else:
        sign = f"cubepack sign {target} --key KEY --model {model}"
        assert sign in done.stdout, done.stdout
        again = cli_in_process([inputs["keys"]["sign"] if word == "KEY" else word
                                for word in sign.split()[1:]], env=dict(os.environ),
                               cwd=tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
    assert cubepack.verify(target, **options(fixture, inputs, fixture["verify"])).ok


@pytest.mark.parametrize("name", [name for name in NAMES if "identity" in spec(name)])
def test_a_private_fixture_rekeys_to_a_new_reader_in_todays_format(name, inputs, tmp_path,
                                                                  monkeypatch):
    """A private cube of any encryption section version is rekeyed by today's code (the way
    an older one reaches today's section): to its reader and a new one, who then opens it."""
    pyrage = pytest.importorskip("pyrage", reason="a new reader's age key is made by pyrage")
    fixture = spec(name)
    if fixture.get("signed") and not SIGNING:
        pytest.skip("a signed fixture: signatures need model_signing (cubepack[sign])")
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "cache"))  # its generations seen
    target = artefact_copy(name, tmp_path)
    before = json.loads((target / constants.LOCK_FILENAME).read_text())["encryption"]
    new = pyrage.x25519.Identity.generate()
    reader = tmp_path / "reader.key"
    reader.write_text(f"{new}\n")
    os.chmod(reader, 0o600)
    keys, own = inputs["keys"], inputs["keys"][fixture["identity"]]
    if fixture.get("signed"):
        cubepack.rekey(target, own, add=[str(new.to_public())], sign_key=str(keys["sign"]),
                       trusted_keys=[str(keys["trusted_key"])])
    else:
        mine = Path(f"{own}.pub") if fixture["identity"] == "ssh" else KEYS / "age.pub"
        cubepack.rekey(target, own, to=[mine.read_text().strip(), str(new.to_public())])
    after = json.loads((target / constants.LOCK_FILENAME).read_text())["encryption"]
    assert after["version"] == lockfile.ENCRYPTION_VERSION
    assert after["generation"] == before.get("generation", 0) + 1
    assert after["hidden_names"] == before["hidden_names"]
    kwargs = {**options(fixture, inputs, fixture["verify"]), "decrypt_with": str(reader)}
    assert cubepack.verify(target, **kwargs).ok


def memos_cube(name: str) -> bool:
    """Is fixture ``name`` a cube MemOS loads activations from (its config.json's act_mem a
    KV cache memory; a private cube's config.json is a ciphertext: its public lock counts its
    activations, and names it unless names are hidden)?"""
    fixture = spec(name)
    folder = COMPAT / name / ARTEFACTS[fixture["artefact"]]
    if fixture["artefact"] != "cube" or not (folder / constants.LOCK_FILENAME).is_file():
        return False
    lock = json.loads((folder / constants.LOCK_FILENAME).read_text())
    if "encryption" in lock:  # a MemOS cube's config.json is encrypted (its name hidden, or not)
        return lock["encryption"]["counts"]["activations"] > 0 and (
            lock["encryption"]["hidden_names"] or "config.json.age" in lock["files"])
    config = folder / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("act_mem", {}).get(
        "backend") == "kv_cache"


@pytest.mark.memos
@pytest.mark.parametrize("name", [name for name in NAMES if memos_cube(name)])
def test_the_memos_hook_loads_the_fixture(name, inputs, models, tmp_path):
    """The MemOS hook (memos environment) verifies the fixture, once fixed as its refusals
    say, and loads every activation into the model MemOS loaded, dropping none."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    import cubepack.memos as hook

    from memos_live import cube_config

    fixture = spec(name)
    if fixture.get("signed") and not SIGNING:
        pytest.skip("a signed fixture: signatures need model_signing (cubepack[sign])")
    target = artefact_copy(name, tmp_path)
    model = models[fixture["model"]]
    for fix in fixture.get("fixes", []):
        target = run_fix(fix, fixture, inputs, target, model, tmp_path)
    asked = {key: value for key, value in options(fixture, inputs, fixture["verify"]).items()
             if key not in ("model", "embedder")}
    config = cube_config(inputs["models"][fixture["model"]])
    loaded = hook.init_from_dir(target, default_config=config, **asked)
    assert loaded.cubepack.loaded and not loaded.cubepack.dropped
    assert len(loaded.act_mem.get_all()) == len(loaded.cubepack.loaded)


def detected_versions(inputs) -> dict[str, set]:
    """Every format version the fixtures hold, read from their bytes."""
    from cubepack.ops._private import open_private

    found: dict[str, set] = {"lock": set(), "kv": set(), "predicate": set(),
                             "encryption": set(), "manifest": set()}
    for name in NAMES:
        fixture = spec(name)
        folder = COMPAT / name / ARTEFACTS[fixture["artefact"]]
        for path in kv_files(folder):
            found["kv"].add(read_kv_header(path).version)
        lock_path = folder / constants.LOCK_FILENAME
        if not lock_path.is_file():
            continue
        lock = json.loads(lock_path.read_text())
        found["lock"].add(lock["lock_version"])
        for envelope in [folder / constants.ATTESTATION_FILENAME,
                         folder / constants.ANCESTORS_FILENAME]:
            if envelope.is_file():
                parsed = (_envelope.read_ancestors(envelope) if envelope.name.startswith(
                    "ancestors") else [_envelope.read_envelope(envelope)])
                found["predicate"] |= {e.statement["predicateType"] for e in parsed}
        if "encryption" in lock:
            found["encryption"].add(lock["encryption"]["version"])
            with open_private(folder, inputs["keys"][fixture["identity"]]) as opened:
                found["manifest"].add(opened.manifest["version"])
    return found


def test_every_readable_version_has_a_fixture(inputs):
    """Each version today's code reads (locks, KV files, attestation predicates, a private
    cube's encryption section and manifest) is held by at least one fixture, as the fixtures'
    own bytes say: a version added to the code without a fixture fails here. (A version the
    code stops reading keeps its fixtures, which must then be refused as their specs say.)"""
    found = detected_versions(inputs)
    readable = {"lock": lockfile.READABLE_VERSIONS, "kv": constants.KV_READABLE_VERSIONS,
                "predicate": _envelope.PREDICATE_TYPES,
                "encryption": lockfile.ENCRYPTION_VERSIONS, "manifest": age.MANIFEST_VERSIONS}
    for what, versions in readable.items():
        missing = set(versions) - found[what]
        assert not missing, f"no fixture holds {what} version(s) {sorted(missing)}: add one"
