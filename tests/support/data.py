"""Constants the fixtures and tests share."""

from pathlib import Path

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
#: The activations of the default packed cube: item id -> the prompt model A prefilled.
ITEMS = {"item-1": [5, 6, 7, 8, 9, 10], "item-2": [11, 12, 13, 14]}
#: The commit model A sits at in the test HF cache (``hub_cached``).
#: The write token of the hub fixture in tests/hub/conftest.py.
HUB_TOKEN = "writer-token"

MODEL_A_COMMIT = "a" * 8 + "0123456789abcdef0123456789abcdef"
#: MemOS's own example cubes (see ../shared/fixtures/memos-examples/NOTICE.md).
EXAMPLES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "memos-examples"
#: Names a cube cannot hold because some file system cannot (a cube is pulled anywhere), and
#: the rule each breaks, as the refusal names it.
RESERVED = "a device name Windows reserves"
UNPORTABLE_NAMES = [
    ("aux.txt", RESERVED), ("AUX", RESERVED), ("notes/Con.json", RESERVED),
    ("nul.tar.gz", RESERVED), ("com1.md", RESERVED), ("Lpt9.txt", RESERVED),
    ("prn", RESERVED), ("com\u00b2.txt", RESERVED), ("nul .txt", RESERVED),
    ("com0.txt", RESERVED), ("CONIN$.txt", RESERVED),
    ("notes./a.txt", "ending in a dot or a space"), ("a.txt.", "ending in a dot or a space"),
    ("a.txt ", "ending in a dot or a space"), ("dir /a.txt", "ending in a dot or a space"),
    ("a<b.txt", "which Windows forbids"), ("a>b.txt", "which Windows forbids"),
    ("ab:c.txt", "which Windows forbids"), ('a"b.txt', "which Windows forbids"),
    ("a|b.txt", "which Windows forbids"), ("a?.txt", "which Windows forbids"),
    ("a*.txt", "which Windows forbids"), ("a\x1fb.txt", "control character"),
]
#: Pairs of names that are one file (or folder) on a case-insensitive or normalising system.
COLLIDING_NAMES = [
    ("Notes.txt", "notes.txt"), ("Docs/a.txt", "docs/b.txt"), ("\ufb01le.txt", "file.txt"),
    ("caf\u00e9.txt", "CAF\u00c9.txt"), ("\uff41.txt", "a.txt"), ("a.txt", "a.txt/b.txt"),
]
