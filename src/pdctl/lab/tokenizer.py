"""A small, deterministic tokenizer for the lab's synthetic model directory.

``build(out_dir)`` writes tokenizer.json (HF ``tokenizers`` WordLevel model, whitespace
pre-tokenizer), tokenizer_config.json (with a GLM-style chat template) and config.json
(model_type glm_moe_dsa). The engine stand-in loads it from the served model directory and the
benchmark client gets the same directory as ``--tokenizer``, so both count tokens identically:
a space-separated run of vocabulary words is exactly one token per word.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = [
    "[UNK]", "<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
    "<|observation|>", "<think>", "</think>",
]
LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris "
    "nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse "
    "cillum eu fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui "
    "officia deserunt mollit anim id est laborum"
).split()
# Words the answer keys and graders use (GPQA "ANSWER: X", AIME \boxed{N}, LongBench "(X)").
ANSWER_WORDS = (
    "ANSWER Answer answer The the correct is are of to a an and or so we I not sure final "
    "Therefore therefore boxed A B C D E result value let compute step thinking think"
).split()
PUNCTUATION = list(".,:;!?()[]{}\\$+-*/=<>'\"%#&_") + ["\\boxed{", "}.", "(A)", "(B)", "(C)", "(D)"]
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MAX_MODEL_LEN = 262144


def vocabulary() -> list[str]:
    """The ordered vocabulary: special tokens, words, numbers 0-999, punctuation, filler words."""
    words: list[str] = []
    seen: set[str] = set()

    def add(w: str) -> None:
        if w not in seen:
            seen.add(w)
            words.append(w)

    for w in SPECIAL_TOKENS + LOREM + ANSWER_WORDS + [str(i) for i in range(1000)] + PUNCTUATION:
        add(w)
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]  # 80
    for a in syllables:
        for b in syllables:
            add(a + b)  # 6,400 two-syllable filler words
    return words


def build(out_dir) -> Path:
    """Write tokenizer.json, tokenizer_config.json and config.json into ``out_dir``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL_TOKENS)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_MODEL_LEN,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model_config = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": len(vocab),
        "max_position_embeddings": MAX_MODEL_LEN,
        "num_nextn_predict_layers": 1,
        "eos_token_id": vocab["<|endoftext|>"],
        "pad_token_id": vocab["<|endoftext|>"],
        "torch_dtype": "bfloat16",
        "_lab_note": "synthetic lab model directory: tokenizer only, no weights",
    }
    (out / "config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":  # python -m pdctl.lab.tokenizer OUT_DIR
    import sys

    print(build(sys.argv[1]))
