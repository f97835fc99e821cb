"""The on-disk formats of a packed cube and the rules over its files. No torch, no HTTP.

- ``_fileset``: which file of a cube folder is what (locked, generated, signing, bookkeeping,
  tolerated, signed): the one rule pack, verify, sign, push and pull apply;
- ``_lock``: ``cubepack.lock``, a registry of sections (each with its closed keys, validation,
  digest, diff, description, attestation rule and typed parse) that every reader and writer
  iterates;
- ``sections``: the lock parsed once into frozen values, one module per section, each memory
  with its ``Locator``; an ``Index`` for a section kept outside the lock;
- ``_cubeconfig`` (``cubepack.yaml``), ``_card`` (the model card, from ``templates/``);
- ``_content``: what a cube may hold (a strict parser per file kind, no pickle anywhere);
- ``_envelope``: DSSE envelopes and in-toto statements, parsed strictly;
- ``_diff``: every change between two locks that moves a digest, by section.
"""
