"""MemOS's side of a cube folder, as MemOS 2.0 writes it. Pure, no MemOS import.

- ``_layout``: its ``config.json`` (memory roles, memory types, file names, the settings that
  would make MemOS run a repository's code);
- ``_pickle``: the allow-list reader for its pickled memories (never ``pickle.load``);
- ``_records``: the producer records MemOS PRs #2302/#2305 write, compared with a pin.
"""
