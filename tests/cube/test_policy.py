"""The trust policy: one object, validated when it is built, honoured by every verb."""

from __future__ import annotations

import pytest

import cubepack
from cubepack import TrustPolicy, UsageError

from envs import once

pytestmark = once


@pytest.mark.parametrize("options, message", [
    ({"on_mismatch": "ignore"}, "on_mismatch must be one of"),
    ({"require_provenance": "signed"}, "require_provenance must be one of"),
    ({"recompute_tokens": 0}, "positive integer"),
    ({"recompute": "no"}, "recompute must be True or False"),
    ({"recompute": 2.5}, "recompute must be True or False"),
    ({"require_signature": "no"}, "require_signature must be True or False"),
    ({"strict_models": "yes"}, "strict_models must be True or False"),
    ({"embedder": ""}, "embedder must be an embedder spec"),
    ({"embedder": 123}, "embedder must be an embedder spec"),
    ({"trusted_keys": 5}, "trusted_keys must be key file paths"),
    ({"trusted_keys": b"ab"}, "trusted_keys must be key file paths"),
    ({"trusted_keys": ["/nonexistent/pub.pem"]}, "not found: /nonexistent/pub.pem"),
    ({"model": ""}, "model must name"),
])
def test_a_bad_value_is_a_usage_error_when_the_policy_is_built(options, message):
    with pytest.raises(UsageError, match=message):
        TrustPolicy(**options)


def test_one_key_path_or_several(tmp_path):
    key = tmp_path / "pub.pem"
    key.write_text("x")
    assert TrustPolicy(trusted_keys=key).trusted_keys == (str(key),)
    assert TrustPolicy(trusted_keys=str(key)).trusted_keys == (str(key),)
    assert TrustPolicy(trusted_keys=[key, key]).trusted_keys == (str(key), str(key))
    assert TrustPolicy(recompute=3) == TrustPolicy(recompute=True, recompute_tokens=3)


def test_verbs_refuse_unknown_options_and_a_policy_that_is_not_one(packed_cube_factory):
    cube = packed_cube_factory()
    with pytest.raises(UsageError, match="Unknown trust option"):
        cubepack.verify(cube, modle="x")
    with pytest.raises(UsageError, match="must be a cubepack.TrustPolicy"):
        cubepack.verify(cube, "zoo/model-a")
    with pytest.raises(UsageError, match="must be a cubepack.TrustPolicy"):
        cubepack.pull("ns/cube", "main")


def test_strict_models_refuses_a_pin_nothing_could_check(packed_cube_factory):
    """The default cube pins a local folder (no Hub revision): verify skips the model check
    without a model, and refuses under strict_models."""
    cube = packed_cube_factory()
    relaxed = cubepack.verify(cube)
    assert [c.ok for c in relaxed.checks if c.name == "model identity"] == [None]
    strict = cubepack.verify(cube, strict_models=True, raise_on_failure=False)
    assert not strict.ok
    assert any(c.name == "model identity" and c.ok is False and "unverified" in c.detail
               for c in strict.checks)


def test_no_verify_cannot_be_combined_with_anything_to_verify():
    for options in ({"recompute": True}, {"model": "x"}, {"strict_models": True},
                    {"require_provenance": "recorded"}, {"embedder": "openai:http://x#m"}):
        with pytest.raises(UsageError, match="--no-verify cannot be combined"):
            cubepack.pull("ns/cube", verify_cube=False, **options)
