"""Settings in a cube's config.json that would make MemOS (transformers, sentence-transformers)
run Python code from a model's repository when it builds the cube's models: refused at pack, at
verify and in the MemOS hook before MemOS reads the config, each naming the JSON path.

The sweep injects ``trust_remote_code: true`` into every object of MemOS's own example configs
(../shared/fixtures/memos-examples), wherever MemOS would or would not read it."""

from __future__ import annotations

import copy
import functools
import json
import shutil

import pytest

import cubepack
from cubepack import UnsafeInputError, VerificationFailed
from cubepack._util import constants, hashing
from cubepack.memos_format._layout import code_running_settings, dotted

from data import EXAMPLES
from helpers import reseal_lock, tree_bytes

pytestmark = pytest.mark.skipif(not (EXAMPLES / "mem_cube_2").is_dir(),
                                reason="../shared/fixtures/memos-examples is not present")

#: MemOS's example cube configs: (name, the folder to copy, its config.json).
EXAMPLE_CUBES = {
    "mem_cube_2": (EXAMPLES / "mem_cube_2", EXAMPLES / "mem_cube_2" / "config.json"),
    "simple_treekvcache": (None, EXAMPLES / "config" / "simple_treekvcache_cube_config.json"),
}


def example_config(name):
    return json.loads(EXAMPLE_CUBES[name][1].read_text())


def object_paths(value, path=()):
    """The path of every JSON object in ``value`` (the test's own walk, recursive on purpose:
    the documents are MemOS's shallow examples)."""
    if isinstance(value, dict):
        yield path
        for key, child in value.items():
            yield from object_paths(child, path + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from object_paths(child, path + (index,))


def injected(config, path, key="trust_remote_code", value=True):
    changed = copy.deepcopy(config)
    node = changed
    for part in path:
        node = node[part]
    node[key] = value
    return changed


def sweep():
    """(example, injected config, the JSON path the refusal must name) for every object of
    every example config."""
    for name in EXAMPLE_CUBES:
        config = example_config(name)
        for path in object_paths(config):
            yield name, injected(config, path), dotted(path + ("trust_remote_code",))


@functools.cache
def cases():
    """The sweep, read when a test first asks for it (never at import: a clone without
    ../shared must collect this module and skip it)."""
    return list(sweep())


def pytest_generate_tests(metafunc):
    """The per-object test's cases, at collection: none (the module's skip names why) when
    MemOS's examples are absent."""
    if {"name", "config", "expected"} <= set(metafunc.fixturenames):
        present = (EXAMPLES / "mem_cube_2").is_dir()
        sweep_ = cases() if present else []
        metafunc.parametrize("name,config,expected", sweep_, ids=[s[2] for s in sweep_])


def test_the_sweep_reaches_every_model_llm_and_embedder_config():
    paths = {expected for _, _, expected in cases()}
    assert len(cases()) >= 25
    for where in ("text_mem.config.extractor_llm.config", "text_mem.config.embedder.config",
                  "text_mem.config.vector_db.config", "act_mem.config.extractor_llm.config",
                  "para_mem.config.extractor_llm.config", "text_mem", "act_mem"):
        assert f"{where}.trust_remote_code" in paths
    assert "trust_remote_code" in paths  # the document's top level


# --- the pure function ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(EXAMPLE_CUBES) + ["memos_config"])
def test_memos_own_example_configs_have_no_code_running_setting(name):
    config = json.loads((EXAMPLES / "config" / "simple_treekvcache_memos_config.json").read_text()) \
        if name == "memos_config" else example_config(name)
    assert code_running_settings(config) == []


def test_trust_remote_code_is_found_in_every_object_of_the_examples(name, config, expected):
    assert [s.path for s in code_running_settings(config)] == [expected]


@pytest.mark.parametrize("key,value,found", [
    ("trust_remote_code", True, True), ("trust_remote_code", "yes", True),
    ("trust_remote_code", 1, True), ("trust_remote_code", None, True),
    ("trust_remote_code", False, False), ("code_revision", "abc123", True),
    ("code_revision", None, False),
    ("auto_map", {"AutoModelForCausalLM": "modeling_evil.Evil"}, True), ("auto_map", None, False)])
def test_each_code_key_is_judged_by_its_value(key, value, found):
    config = injected(example_config("mem_cube_2"), ("act_mem", "config", "extractor_llm",
                                                     "config"), key, value)
    settings = code_running_settings(config)
    assert [s.path for s in settings] == ([f"act_mem.config.extractor_llm.config.{key}"]
                                          if found else [])


def test_a_sentence_transformer_embedder_runs_remote_code_unless_told_not_to():
    """MemOS's SenTranEmbedderConfig defaults trust_remote_code to true: leaving it out is the
    setting that runs code, and is named where it would go."""
    config = example_config("mem_cube_2")
    config["text_mem"]["config"]["embedder"] = {
        "backend": "sentence_transformer", "config": {"model_name_or_path": "org/embedder"}}
    [setting] = code_running_settings(config)
    assert setting.path == "text_mem.config.embedder.config.trust_remote_code"
    assert "defaults it to true" in setting.found and "false" in setting.fix
    config["text_mem"]["config"]["embedder"]["config"]["trust_remote_code"] = False
    assert code_running_settings(config) == []


def test_names_are_quoted_and_items_indexed_and_deep_documents_are_one_finding():
    assert [s.path for s in code_running_settings(
        {"a.b": {"x": [{"trust_remote_code": True}]}})] == ['["a.b"].x[0].trust_remote_code']
    deep = node = {}
    for _ in range(5000):
        node["n"] = {}
        node = node["n"]
    node["trust_remote_code"] = True
    [setting] = code_running_settings(deep)  # a document built in memory: no RecursionError
    assert "nesting deeper than 64 levels" in setting.found
    cyclic: dict = {}
    cyclic["self"] = cyclic
    assert "nesting deeper" in code_running_settings(cyclic)[0].found


# --- pack --------------------------------------------------------------------------------------

def cube_folder(tmp_path, name, config):
    folder, _ = EXAMPLE_CUBES[name]
    cube = tmp_path / name
    if folder is not None:
        shutil.copytree(folder, cube)
    else:
        cube.mkdir(parents=True)
    (cube / "config.json").write_text(json.dumps(config, indent=2))
    return cube


def test_pack_refuses_every_injected_setting_naming_its_path_and_changes_nothing(tmp_path):
    for index, (name, config, expected) in enumerate(cases()):
        cube = cube_folder(tmp_path / str(index), name, config)
        before = tree_bytes(cube)
        with pytest.raises(UnsafeInputError) as refused:
            cubepack.pack(cube, legacy_pickle=True)
        message = str(refused.value)
        assert expected + " (true; set it to false)" in message, (expected, message)
        assert str(cube / "config.json") in message and "pack again" in message
        assert tree_bytes(cube) == before


def test_cli_pack_exits_1_naming_the_path(tmp_path, capsys):
    from cubepack.cli import main

    config = injected(example_config("mem_cube_2"),
                      ("text_mem", "config", "embedder", "config"))
    cube = cube_folder(tmp_path, "mem_cube_2", config)
    assert main(["pack", str(cube), "--legacy-pickle"]) == 1
    assert "text_mem.config.embedder.config.trust_remote_code" in capsys.readouterr().err


# --- verify, and the unmodified examples ---------------------------------------------------------

@pytest.fixture(scope="module")
def packed_examples(tmp_path_factory, qwen3_snapshot):
    """Each example cube, unmodified, packed (its producer names resolve through the HF cache)."""
    root = tmp_path_factory.mktemp("examples")
    packed = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        for name in EXAMPLE_CUBES:
            cube = cube_folder(root, name, example_config(name))
            cubepack.pack(cube, legacy_pickle=True)
            packed[name] = cube
    return packed


def with_config(cube, tmp_path, config):
    """A copy of a packed cube whose config.json is ``config``, the lock resealed to it (as
    whoever pushed last can): only the content rule can refuse it."""
    copy_dir = tmp_path / "cube"
    if copy_dir.exists():
        shutil.rmtree(copy_dir)
    shutil.copytree(cube, copy_dir)
    path = copy_dir / "config.json"
    path.write_text(json.dumps(config, indent=2))

    def change(lock):
        lock["files"]["config.json"] = {"sha256": hashing.sha256_file(path),
                                        "size": path.stat().st_size}
    reseal_lock(copy_dir, change)
    return copy_dir


def test_the_unmodified_examples_pack_and_verify(packed_examples):
    for cube in packed_examples.values():
        report = cubepack.verify(cube)
        assert report.ok
        assert [c.ok for c in report.checks if c.name == "content"] == [True]


def test_verify_refuses_every_injected_setting_naming_its_path(packed_examples, tmp_path):
    for name, config, expected in cases():
        cube = with_config(packed_examples[name], tmp_path, config)
        report = cubepack.verify(cube, raise_on_failure=False)
        [failure] = report.failures
        assert (failure.name, failure.subject) == ("content", "config.json")
        assert expected + " (true; set it to false)" in failure.detail, (expected, failure)
        with pytest.raises(VerificationFailed, match=expected.replace("[", r"\[")):
            cubepack.verify(cube)


# --- the MemOS hook -----------------------------------------------------------------------------

@pytest.fixture
def hooked(monkeypatch):
    """The hook installed, and MemOS's own config reader made to fail the test if it runs: a
    refusal must come before MemOS reads (let alone builds) anything."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    from memos.configs.mem_cube import GeneralMemCubeConfig

    import cubepack.memos as hook

    hook.install(require_pin=False)
    try:
        yield hook, GeneralMemCubeConfig
    finally:
        hook.uninstall()


def test_the_hook_refuses_every_injected_setting_before_memos_reads_the_config(
        hooked, packed_examples, tmp_path, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube

    _, config_class = hooked
    monkeypatch.setattr(config_class, "from_json_file", classmethod(
        lambda cls, path: pytest.fail(f"MemOS read {path}")))
    for index, (name, config, expected) in enumerate(cases()):
        unpacked = cube_folder(tmp_path / f"unpacked-{index}", name, config)
        with pytest.raises(UnsafeInputError) as refused:
            GeneralMemCube.init_from_dir(str(unpacked))  # MemOS's own call, hooked
        assert expected + " (true; set it to false)" in str(refused.value)
        packed = with_config(packed_examples[name], tmp_path, config)
        with pytest.raises(VerificationFailed) as failed:
            GeneralMemCube.init_from_dir(str(packed), memory_types=["act_mem"])
        assert expected + " (true; set it to false)" in str(failed.value)


def test_the_hook_checks_the_config_even_when_verify_is_not_what_refuses(
        hooked, packed_examples, tmp_path):
    """The loader's own check, below verify: a cube whose config.json changed after verify
    read it is refused before MemOS builds it."""
    from cubepack.memos._load import refuse_code_settings

    config = injected(example_config("mem_cube_2"), ("act_mem", "config", "extractor_llm",
                                                     "config"))
    cube = cube_folder(tmp_path, "mem_cube_2", config)
    with pytest.raises(UnsafeInputError, match=r"act_mem\.config\.extractor_llm\.config\."
                                               "trust_remote_code"):
        refuse_code_settings(cube)
    (cube / "config.json").write_text(json.dumps(example_config("mem_cube_2")))
    refuse_code_settings(cube)  # the unmodified example passes


def test_the_unmodified_example_loads_through_the_hook(hooked, packed_examples, qwen3_snapshot,
                                                       monkeypatch):
    from memos.mem_cube.general import GeneralMemCube

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cube = GeneralMemCube.init_from_dir(str(packed_examples["mem_cube_2"]),
                                        memory_types=["act_mem"])
    [item] = cube.act_mem.get_all()
    assert item.memory.get_seq_length() == 7
    assert (packed_examples["mem_cube_2"] / constants.LOCK_FILENAME).is_file()
