"""Promise 1: a claim never gains strength on its way through a later step.

SECURITY.md's table: the Hub's file metadata (``remote model``) is *claimed*; a pin is
*signed* only when "the signer fingerprinted [it] itself" (the attestation's
``proved.producers``). A vLLM cube's producer is pinned by ``pack`` from the endpoint's
metadata (``fingerprint_hub``: LFS sha256 values and a header, as the endpoint states them; no
weight byte is read). ``pack --sign-key`` then states that pin in ``proved.producers``
(``Proved.everything_of``: every pin with an identity), so a verifier with the signer's key and
``--strict-models`` accepts it as *signed* evidence, although no one ever hashed the weights
(the same verifier's ``--remote`` check of the very same metadata is ``claimed`` and does not
satisfy ``--strict-models``). ``cubepack sign`` of the same cube, by contrast, states the pin
as claimed: the two signing steps disagree about the same evidence.
"""

from __future__ import annotations

import base64
import json
import shutil

import pytest

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack._util import constants
from cubepack.testing.hub import InstrumentedHub, upload_folder

from helpers import make_key
from memos_format import write_vllm_cube

REPO = "tiny-org/served"
PROMPTS = {"p-1": "<prompt one>", "p-2": "<prompt two>"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import file_download

    with InstrumentedHub(tmp_path / "hub-root") as server:
        monkeypatch.setattr(hub_constants, "ENDPOINT", server.url)
        template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
        for module in (hub_constants, file_download):
            if hasattr(module, "HUGGINGFACE_CO_URL_TEMPLATE"):
                monkeypatch.setattr(module, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def proved_producers(cube):
    envelope = json.loads((cube / constants.ATTESTATION_FILENAME).read_text())
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]["proved"]["producers"]


def test_a_pin_read_from_hub_metadata_is_not_signed_as_proved(hub, zoo, tmp_path):
    private, public = make_key(tmp_path, "alice")
    upload_folder(hub.url, REPO, zoo["a"])
    plain = write_vllm_cube(tmp_path / "plain", REPO, PROMPTS)
    cubepack.pack(plain, legacy_pickle=True)  # the pin: the endpoint's metadata
    assert not list((tmp_path / "hf-cache").rglob("*.safetensors"))  # no weights here, ever
    by_sign = tmp_path / "by-sign"
    shutil.copytree(plain, by_sign)
    cubepack.sign(by_sign, private)
    assert "act_mem" not in proved_producers(by_sign)  # sign: the pin is claimed

    by_pack = write_vllm_cube(tmp_path / "by-pack", REPO, PROMPTS)
    cubepack.pack(by_pack, legacy_pickle=True, sign_key=private)
    report = cubepack.verify(by_pack, trusted_keys=[public], strict_models=True,
                             raise_on_failure=False)
    backing = [c.basis for c in report.checks if c.name == "model identity" and c.ok]
    assert "act_mem" not in proved_producers(by_pack) and not report.ok, (
        f"pack --sign-key signed the endpoint's metadata as a fingerprint it took: "
        f"strict_models accepted the pin on {backing} evidence")
