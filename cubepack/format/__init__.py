"""The on-disk formats of a packed cube and the rules over its files (no torch, no HTTP).

- :mod:`._fileset`: which file of a cube folder is what (locked, generated, signing,
  bookkeeping, tolerated, signed): the one rule pack, verify, sign, push and pull apply.
"""
