"""The trust policy: what a verification, a pull or a load must prove, in one object, and the
one rule every consumer applies to it.

``verify``, ``pull``, ``migrate``, ``load_adapter``, ``load_kv_cache``, the MLX load, the MemOS
hook and the CLI each take one :class:`TrustPolicy`, instead of copying keyword arguments by
hand. It is validated when it is built (before any work), so a bad value is a
:class:`~cubepack.errors.UsageError` at once. A consumer honours it whole or refuses it: each
states the fields it applies (:data:`HONOURED`) and calls :meth:`TrustPolicy.require_honoured`
first, so a field it cannot apply (a signature asked of a lone KV file, a model handed to the
MemOS hook, which uses the model MemOS loads) is a UsageError, never silently dropped.

No module outside ``trust/`` reads a field (``tests/test_owners.py``): a consumer asks the
policy (:meth:`TrustPolicy.asks` a check, :meth:`~TrustPolicy.recomputation`,
:meth:`~TrustPolicy.reembedding`, :meth:`~TrustPolicy.mismatch_action`...) or lets it apply
itself (:meth:`~TrustPolicy.require_pinned`, :meth:`~TrustPolicy.without`), so what a field
means is decided here once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .._util.checks import Catalogue
from .._util.revision import is_commit
from ..errors import UsageError
from ..format._provenance import LEVELS as PROVENANCE_LEVELS
from ..format._provenance import RECOMPUTED

#: What to do with a memory that does not match the live model: refuse (strictest), skip it,
#: or rebuild it with the live model.
POLICIES = ("error", "drop", "rebuild")
#: Memories a re-embedding check draws (all, when the file holds fewer), at random by the
#: verifier: the policy's default (``embedder_sample``), so it lives with the policy.
SAMPLE_SIZE = 16


@dataclass(frozen=True)
class Recomputation:
    """How a consumer proves KV caches by the producer's own prefill (see
    :meth:`TrustPolicy.recomputation`)."""

    #: recomputation was asked for
    asked: bool
    #: positions compared per cache, drawn at random; None: every position
    sample: int | None
    #: the seed of the draws (positions, probe tokens); None: a fresh one, reported
    seed: int | None

    @property
    def full(self) -> bool:
        """Every position is compared: the only recomputation that can prove ``recomputed``."""
        return self.asked and self.sample is None


@dataclass(frozen=True)
class Reembedding:
    """How a consumer checks a text memory's vectors by re-embedding memories (see
    :meth:`TrustPolicy.reembedding`)."""

    #: the embedder spec to check; None: none given (the MemOS hook checks the one MemOS loads)
    embedder: str | None
    #: memories re-embedded, drawn at random (0: all)
    sample: int
    #: the seed of the draw; None: a fresh one, reported
    seed: int | None


@dataclass(frozen=True)
class TrustPolicy:
    """What must hold before a cube is accepted.

    Attributes:
        model: the producer to check the pins against (a folder, Hub id or loaded model).
            None: the pinned revision in the HF cache, when it is there.
        trusted_keys: public keys (PEM paths) whose signature is accepted; any given makes a
            valid signature by one of them required.
        require_signature: refuse an unsigned cube even without ``trusted_keys``.
        require_lineage: refuse a cube whose attestation chain does not verify up to a trusted
            key: its own attestation (``cubepack.intoto.json``) and, for a derived cube, each
            ancestor's in ``lineage/ancestors.intoto.json`` up to a root. Needs
            ``trusted_keys``.
        recompute: prove every KV cache by the producer's own prefill.
        recompute_tokens: check this many positions per cache, drawn at random by the verifier,
            instead of all (implies ``recompute``; a partial check never proves a cache
            ``recomputed``; at least the cache's token count compares every position, a full
            check).
        seed: the seed of every random draw the verifier makes (positions and probe tokens of
            a recomputation, the memories an embedder check re-embeds), to repeat a run; None
            draws a fresh one (the report gives it).
        require_provenance: ``"recorded"`` or ``"recomputed"``: refuse activations whose
            producer label is backed by less.
        embedder: an embedder spec that must reproduce the text memory's vectors.
        embedder_sample: how many memories it re-embeds, drawn at random (default 16; 0: all,
            which a few foreign vectors among many cannot escape).
        strict_models: refuse a cube whose pinned model no model was fingerprinted against
            (here, or by a trusted signer); the Hub's metadata does not satisfy it.
        on_mismatch: for loads into a live model (the MemOS hook): ``"error"``, ``"drop"`` or
            ``"rebuild"``.
        require_pin: a cube named on a Hub must be named at a 40-hex commit, never a branch or
            tag (the MemOS hook's default; ``pull`` applies it too).
    """

    model: Any = None
    trusted_keys: tuple[str, ...] = ()
    require_signature: bool = False
    require_lineage: bool = False
    recompute: bool = False
    recompute_tokens: int | None = None
    seed: int | None = None
    require_provenance: str | None = None
    embedder: str | None = None
    embedder_sample: int | None = None
    strict_models: bool = False
    on_mismatch: str = "error"
    require_pin: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "trusted_keys", key_paths(self.trusted_keys))
        recompute, tokens = self.recompute, self.recompute_tokens
        if type(recompute) is int:  # recompute=N: the old spelling of recompute_tokens=N
            recompute, tokens = True, tokens or recompute
        for name, value in (("recompute", recompute), ("require_signature", self.require_signature),
                            ("require_lineage", self.require_lineage),
                            ("strict_models", self.strict_models),
                            ("require_pin", self.require_pin)):
            if type(value) is not bool:
                raise UsageError(f"{name} must be True or False, not {value!r}.")
        if tokens is not None and (type(tokens) is not int or tokens < 1):
            raise UsageError(f"recompute_tokens must be a positive integer, not {tokens!r}.")
        if self.seed is not None and type(self.seed) is not int:
            raise UsageError(f"seed must be an integer, not {self.seed!r}.")
        if self.require_lineage and not self.trusted_keys:  # it could never be met
            raise UsageError("require_lineage (--require-lineage) needs the keys a chain must "
                             "verify up to; give them with trusted_keys (--trusted-key PUB.pem).")
        object.__setattr__(self, "recompute", recompute or tokens is not None)
        object.__setattr__(self, "recompute_tokens", tokens)
        if self.embedder is not None and (not isinstance(self.embedder, str) or
                                          not self.embedder.strip()):
            raise UsageError(f"embedder must be an embedder spec (a model folder, "
                             f"openai:<url>#<model> or ollama:<url>#<model>), not "
                             f"{self.embedder!r}.")
        if self.embedder_sample is not None and (type(self.embedder_sample) is not int
                                                 or self.embedder_sample < 0):
            raise UsageError(f"embedder_sample must be 0 (all) or a positive integer, not "
                             f"{self.embedder_sample!r}.")
        if self.model is not None and isinstance(self.model, str) and not self.model.strip():
            raise UsageError("model must name a model folder or Hub id, not an empty string.")
        if self.require_provenance is not None and \
                self.require_provenance not in PROVENANCE_LEVELS:
            raise UsageError(f"require_provenance must be one of {', '.join(PROVENANCE_LEVELS)}, "
                             f"not {self.require_provenance!r}.")
        if self.on_mismatch not in POLICIES:
            raise UsageError(f"on_mismatch must be one of {', '.join(POLICIES)}, not "
                             f"{self.on_mismatch!r}.")

    @classmethod
    def build(cls, policy: TrustPolicy | None = None, **options: Any) -> TrustPolicy:
        """``policy`` (or the default) with ``options`` applied; None values are ignored.

        Raises:
            UsageError: ``policy`` is not a TrustPolicy; an option that is not a policy field,
                or a value it refuses.
        """
        if policy is not None and not isinstance(policy, cls):
            raise UsageError(f"The policy must be a cubepack.TrustPolicy, not "
                             f"{type(policy).__name__} {policy!r}; pass other options by name "
                             "(e.g. verify(cube, model=...)).")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise UsageError(f"Unknown trust option(s) {', '.join(unknown)}; a TrustPolicy has "
                             f"{', '.join(sorted(known))}.")
        given = {key: value for key, value in options.items() if value is not None}
        return replace(policy or cls(), **given)

    @property
    def signature_required(self) -> bool:
        return self.require_signature or bool(self.trusted_keys)

    def asked(self) -> list[str]:
        """The fields this policy sets (those that differ from the default policy's)."""
        default = TrustPolicy()
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]

    def require_honoured(self, consumer: str) -> None:
        """The one rule: ``consumer`` (a key of :data:`HONOURED`) applies every field this
        policy sets, or the request is refused before any work.

        Raises:
            UsageError: naming each field the consumer cannot apply and what to do instead.
        """
        honoured, instead = HONOURED[consumer]
        refused = [name for name in self.asked() if name not in honoured]
        if refused:
            raise UsageError(f"{consumer} cannot honour {', '.join(refused)} of the trust "
                             f"policy, and drops no field silently: {instead}")
        # A consumer that checks the embedder given needs one to apply the sample size to
        # (the MemOS hook applies it to the embedder MemOS loads).
        if "embedder" in honoured and self.embedder_sample is not None and self.embedder is None:
            raise UsageError("embedder_sample (--embedder-sample) says how many memories "
                             "--embedder re-embeds; give --embedder too, or drop it.")

    def tightened(self, other: TrustPolicy, said: Iterable[str] | None = None) -> TrustPolicy:
        """This policy, made at least as strict as ``other`` in every field ``said`` (default:
        every field ``other`` sets) and never looser (a second ``install`` of the MemOS hook):
        requirements are or-ed, trusted keys kept once set, the mismatch policy moves towards
        ``"error"``, the provenance asked towards ``recomputed``, a full recomputation beats a
        sampled one. A field ``other`` leaves unsaid is no request (its default is not one)."""
        said = set(other.asked() if said is None else said)
        other = replace(self, **{f.name: getattr(other, f.name) for f in fields(other)
                                 if f.name in said})
        def stronger(a: Any, b: Any, order: tuple[Any, ...]) -> Any:
            return max(a, b, key=order.index)

        full = (self.recompute and self.recompute_tokens is None) or \
            (other.recompute and other.recompute_tokens is None)
        tokens = None if full else max(
            (t for t in (self.recompute_tokens, other.recompute_tokens) if t is not None),
            default=None)
        sample = 0 if 0 in (self.embedder_sample, other.embedder_sample) else max(
            (n for n in (self.embedder_sample, other.embedder_sample) if n is not None),
            default=None)
        return replace(
            self,
            trusted_keys=self.trusted_keys or other.trusted_keys,
            require_signature=self.require_signature or other.require_signature,
            require_lineage=self.require_lineage or other.require_lineage,
            recompute=self.recompute or other.recompute, recompute_tokens=tokens,
            require_provenance=stronger(self.require_provenance, other.require_provenance,
                                        (None, *PROVENANCE_LEVELS)),
            embedder_sample=sample,
            strict_models=self.strict_models or other.strict_models,
            on_mismatch=stronger(self.on_mismatch, other.on_mismatch, tuple(reversed(POLICIES))),
            require_pin=self.require_pin or other.require_pin,
            model=self.model if self.model is not None else other.model,
            embedder=self.embedder or other.embedder,
            seed=self.seed if self.seed is not None else other.seed)

    def said_over(self, base: TrustPolicy, said: Iterable[str]) -> TrustPolicy:
        """``base`` with the fields ``said`` (names of fields) taken from this policy: what a
        call says, over the defaults it did not restate (a first ``install`` of the MemOS hook
        over the environment's settings)."""
        return replace(base, **{name: getattr(self, name) for name in said})

    def for_folder(self) -> TrustPolicy:
        """The part a cube folder is verified against before its model is loaded: for the
        MemOS hook, which applies the rest (recomputation, provenance, the embedder sample, the
        mismatch policy) with the model and embedder MemOS loads."""
        return replace(self, recompute=False, recompute_tokens=None, require_provenance=None,
                       embedder_sample=None, seed=None, on_mismatch="error", require_pin=False)

    # --- what a consumer asks (no module outside trust/ reads a field) ------------------------

    def asks(self, check: Catalogue) -> bool:
        """Does this policy require ``check`` to run and pass (a skip of it is a refusal)? The
        one mapping from the policy's fields to the checks they ask for: ``signature``
        (``require_signature`` or ``trusted_keys``), ``lineage``, ``model identity``
        (``strict_models``), ``recompute``, ``provenance`` (``require_provenance``),
        ``embedder``."""
        _require_entry(check)
        asked = {Catalogue.SIGNATURE: self.signature_required,
                 Catalogue.LINEAGE: self.require_lineage,
                 Catalogue.MODEL_IDENTITY: self.strict_models,
                 Catalogue.RECOMPUTE: self.recompute,
                 Catalogue.PROVENANCE: self.require_provenance is not None,
                 Catalogue.EMBEDDER: self.embedder is not None}
        return asked.get(check, False)

    def asked_checks(self) -> list[Catalogue]:
        """The checks this policy asks for (:meth:`asks`), in a report's order."""
        return [entry for entry in Catalogue if self.asks(entry)]

    def without(self, *checks: Catalogue) -> TrustPolicy:
        """This policy, no longer asking for ``checks`` (a consumer that applies them itself, or
        a pass that another one covers: a private cube's decrypted pass leaves the signature
        and lineage to the public pass)."""
        dropped: dict[str, Any] = {}
        for check in checks:
            _require_entry(check)
            dropped.update({Catalogue.SIGNATURE: {"trusted_keys": (),
                                                  "require_signature": False},
                            Catalogue.LINEAGE: {"require_lineage": False},
                            Catalogue.MODEL_IDENTITY: {"strict_models": False},
                            Catalogue.RECOMPUTE: {"recompute": False, "recompute_tokens": None},
                            Catalogue.PROVENANCE: {"require_provenance": None},
                            Catalogue.EMBEDDER: {"embedder": None, "embedder_sample": None},
                            }[check])
        return replace(self, **dropped)

    def honoured_by(self, consumer: str) -> TrustPolicy:
        """The part of this policy ``consumer`` (a key of :data:`HONOURED`) applies: what a
        caller hands on once it applied the rest itself (``pull`` checks ``require_pin`` where
        the cube is named, then verifies)."""
        honoured, _ = HONOURED[consumer]
        default = TrustPolicy()
        return replace(self, **{name: getattr(default, name) for name in self.asked()
                                if name not in honoured})

    def model_given(self) -> Any:
        """The model pins are checked against (a folder, Hub id or loaded model); None: none
        given (the pinned revision in the HF cache, when it is there)."""
        return self.model

    def trusted(self) -> tuple[str, ...]:
        """The public keys (paths) whose signatures this policy trusts; empty: none."""
        return self.trusted_keys

    def recomputation(self) -> Recomputation:
        """Whether KV caches are proved by the producer's prefill, on how many positions, and
        the seed of the draw (``recompute_tokens`` implies ``recompute``)."""
        return Recomputation(self.recompute, self.recompute_tokens, self.seed)

    def reembedding(self) -> Reembedding:
        """The embedder to check, how many memories it re-embeds (default
        :data:`SAMPLE_SIZE`; 0: all) and the seed of the draw."""
        sample = SAMPLE_SIZE if self.embedder_sample is None else self.embedder_sample
        return Reembedding(self.embedder, sample, self.seed)

    def required_provenance(self) -> str | None:
        """The producer label each activation must be backed by (proved now or signed):
        ``recorded`` or ``recomputed``; None: none required."""
        return self.require_provenance

    def proves_by_recomputing(self) -> bool:
        """Does the recomputation this policy asks for establish the provenance it requires,
        with no lock to read a label from (an unpacked folder)? ``recomputed`` needs every
        position; a sampled check proves ``recorded``."""
        return self.recompute and (self.require_provenance != RECOMPUTED
                                   or self.recompute_tokens is None)

    def mismatch_action(self) -> str:
        """What a load into a live model does with a memory that does not match it:
        ``error``, ``drop`` or ``rebuild``."""
        return self.on_mismatch

    def require_pinned(self, revision: str | None, named: str, pin_it: str) -> None:
        """``require_pin``: a cube named at a branch or tag (``revision``, None: the default
        branch) is refused before any request; ``named`` says what was named, ``pin_it`` how
        to name the commit instead.

        Raises:
            UsageError: the revision is not a 40-hex commit and a pin is required.
        """
        if self.require_pin and not is_commit(revision or ""):
            raise UsageError(f"Refusing {named}: a branch or tag can move, and a pinned "
                             f"revision was required (require_pin). {pin_it}")

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if data["model"] is not None and not isinstance(data["model"], (str, Path)):
            data["model"] = type(data["model"]).__name__
        data["model"] = str(data["model"]) if data["model"] is not None else None
        data["trusted_keys"] = list(self.trusted_keys)
        return data


def _require_entry(check: Any) -> None:
    """A check is named by its catalogue entry, never by a string spelled again."""
    if not isinstance(check, Catalogue):
        raise TypeError(f"a check is named by its entry of cubepack._util.checks.Catalogue, "
                        f"not {check!r}")


_ALL = frozenset(f.name for f in fields(TrustPolicy))
#: What each consumer applies: (the fields it honours, what to do for the others).
HONOURED: dict[str, tuple[frozenset[str], str]] = {
    "verify": (_ALL - {"on_mismatch", "require_pin"},
               "on_mismatch is for loads into a live model (the MemOS hook), require_pin for a "
               "cube named on a Hub (pull, the hook)."),
    "pull": (_ALL - {"on_mismatch"},
             "on_mismatch is for loads into a live model (the MemOS hook)."),
    "migrate": (_ALL - {"on_mismatch", "require_pin"},
                "migrate verifies a local folder: on_mismatch and require_pin do not apply."),
    "load_adapter": (_ALL - {"on_mismatch", "require_pin"},
                     "load_adapter verifies a local folder and refuses any other base: "
                     "on_mismatch and require_pin do not apply."),
    "load_kv_cache": (frozenset({"recompute", "recompute_tokens", "seed"}),
                      "a KV file alone carries no signature, lineage, pins or provenance: "
                      "verify the cube it belongs to (cubepack.verify with that policy), then "
                      "load its KV files; load_kv_cache itself proves the cache with the model "
                      "given (recompute=True)."),
    "the MLX load": (frozenset({"recompute", "recompute_tokens", "seed"}),
                     "a prompt cache alone carries no signature, lineage, pins or provenance: "
                     "verify its cube first; the MLX load proves the cache with the model given "
                     "(recompute=True)."),
    "encrypt": (frozenset({"trusted_keys", "require_signature"}),
                "encrypt checks who signed the clear cube it encrypts (trusted_keys, "
                "require_signature); to prove more of it (models, recomputation, provenance, "
                "the embedder), verify it first with that policy (cubepack verify)."),
    "rekey": (frozenset({"trusted_keys", "require_signature"}),
              "rekey checks who signed the private cube it re-encrypts (trusted_keys, "
              "require_signature); to prove more of it, verify it first with that policy and "
              "its identity (cubepack verify --identity KEY)."),
    "the MemOS hook": (_ALL - {"model", "embedder"},
                       "the hook checks the model and the embedder MemOS loads (the cube's "
                       "config.json names them); to check another, verify the cube first "
                       "(cubepack.verify(cube, model=..., embedder=...))."),
}


def key_paths(keys: Any) -> tuple[str, ...]:
    """Trusted-key paths as a tuple of strings: one path (str or Path) or several; each must be
    an existing file, so a typo is a usage error, not an "unsigned" refusal later."""
    if keys is None:
        return ()
    if isinstance(keys, (str, Path)):
        keys = (keys,)
    if not isinstance(keys, (list, tuple, set, frozenset)) or \
            not all(isinstance(key, (str, Path)) for key in keys):
        raise UsageError(f"trusted_keys must be key file paths, not {keys!r}.")
    missing = [str(key) for key in keys if not Path(key).is_file()]
    if missing:
        raise UsageError(f"Trusted key file(s) not found: {', '.join(missing)}.")
    return tuple(str(key) for key in keys)
