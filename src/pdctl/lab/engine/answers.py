"""What the stand-in answers: text from an answer key (correct or wrong, chosen
deterministically per prompt) or lorem filler, cut into output tokens."""
from __future__ import annotations

import hashlib
import json
import random

from pdctl.lab.tokenizer import LOREM


def prompt_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_correct(sha: str, rate: float) -> bool:
    """correct iff int(sha[:8], 16) / 2**32 < rate (the documented, deterministic rule)."""
    return int(sha[:8], 16) / 2**32 < rate


class AnswerKey:
    def __init__(self, path: str = "", correct_rate=None, mode: str = "normal"):
        self.entries: dict = {}
        self.rate = 1.0
        if path:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            self.entries = data.get("entries", {})
            self.rate = float(data.get("correct_rate", 1.0))
        if correct_rate is not None:
            self.rate = float(correct_rate)
        self.mode = mode

    def answer(self, last_user_text: str | None):
        """Return (reasoning, content) or None when the prompt is not in the key."""
        if self.mode == "unparsable":
            return ("", "I could not settle on a result for this one, sorry.")
        if last_user_text is None:
            return None
        sha = prompt_sha(last_user_text)
        entry = self.entries.get(sha)
        if entry is None:
            return None
        text = entry["correct"] if is_correct(sha, self.rate) else entry["wrong"]
        return (entry.get("reasoning", "") or "", text)


def lorem_pieces(n: int, seed: str, start_with_space: bool = False) -> list[str]:
    """n output tokens of filler: one vocabulary word per token."""
    rng = random.Random(seed)
    words = rng.choices(LOREM, k=n)
    return [(" " if (i or start_with_space) else "") + w for i, w in enumerate(words)]


def text_pieces(tokenizer, text: str) -> list[str]:
    """Cut text into one piece per token (leading whitespace stays with the token)."""
    if not text:
        return []
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    pieces, prev = [], 0
    for _, end in offsets:
        pieces.append(text[prev:end])
        prev = end
    if pieces and prev < len(text):
        pieces[-1] += text[prev:]
    return pieces
