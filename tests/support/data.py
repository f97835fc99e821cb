"""Constants the fixtures and tests share."""

from pathlib import Path

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
#: The activations of the default packed cube: item id -> the prompt model A prefilled.
ITEMS = {"item-1": [5, 6, 7, 8, 9, 10], "item-2": [11, 12, 13, 14]}
#: The commit model A sits at in the test HF cache (``hub_cached``).
MODEL_A_COMMIT = "a" * 8 + "0123456789abcdef0123456789abcdef"
#: MemOS's own example cubes (see ../shared/fixtures/memos-examples/NOTICE.md).
EXAMPLES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "memos-examples"
