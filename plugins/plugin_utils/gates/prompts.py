"""Prompt builders and answer extraction, one pair per benchmark.

What is graded is the final answer in the response's ``content``; vLLM 0.33's reasoning parser puts
the model's thinking in a separate ``reasoning`` field, which is never graded.

- AIME 2025: the answer is the content of the LAST balanced ``\\boxed{...}``; it must be an integer
  (0-999) equal to the reference.
- GPQA Diamond: the four choices are shuffled deterministically per item (seed + item id), the model is
  asked for a final line ``ANSWER: X``, and the LAST match of ``(?i)answer\\s*:\\s*\\(?([A-D])`` counts.
- LongBench v2: the official zero-shot template (document, question, four choices, "Format your response
  as follows: \\"The correct answer is (insert answer here)\\""), graded like the official scorer: the first
  "The correct answer is (X)", else "The correct answer is X", after removing markdown asterisks.

Extraction returns None when no answer can be read (unparsable counts as wrong and is reported).
"""
from __future__ import annotations

import hashlib
import random
import re

LETTERS = "ABCD"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- AIME -----------------------------------------------------------------------------------------

AIME_TEMPLATE = (
    "Solve the following competition math problem. Reason step by step. The answer is an integer "
    "between 0 and 999; put it, and nothing else, inside \\boxed{{}} at the end of your response.\n\n"
    "{problem}"
)


def aime_prompt(problem: str) -> str:
    return AIME_TEMPLATE.format(problem=problem.strip())


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last balanced \\boxed{...} (or \\fbox{...}); None if there is none or it never closes."""
    if not text:
        return None
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
        # unbalanced: try the previous \boxed
    return None


_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")


def normalize_integer(answer: str) -> int | None:
    """'033', '$33$', '\\text{33}', '1,000', '33.0', '33^\\circ' -> int; anything else -> None."""
    s = answer.strip()
    previous = None
    while previous != s:
        previous = s
        s = _TEXT_WRAPPER.sub(r"\1", s)
    s = s.replace("$", "").replace(",", "").replace("\\!", "").replace("\\ ", "").strip()
    s = re.sub(r"\^\s*\{?\\circ\}?$", "", s).strip()
    s = re.sub(r"\\%$|%$", "", s).strip()
    m = re.fullmatch(r"([+-]?\d+)(?:\.0+)?", s)
    return int(m.group(1)) if m else None


# A final answer stated in words when the model did not box it: "**Final answer:** 70", "the answer is 70."
_AIME_STATED = re.compile(r"(?i:answer)(?:[\s*_]*:|\s+is\s*:?)[\s*_$]*(\d{1,3})(?![\d,/]|\.\d)[\s*_$]*(?:\.|$)", re.M)


def aime_extract(content: str) -> str | None:
    """The last balanced \\boxed{}; else the last "answer: N" / "answer is N" the response ends on."""
    boxed = last_boxed(content)
    if boxed is not None:
        return boxed
    stated = _AIME_STATED.findall(content or "")
    return stated[-1] if stated else None


def aime_correct(extracted: str | None, reference) -> bool:
    if extracted is None:
        return False
    value = normalize_integer(extracted)
    return value is not None and value == int(str(reference).strip())


# --- GPQA -----------------------------------------------------------------------------------------

GPQA_TEMPLATE = (
    "Answer the following multiple-choice question. Think step by step, then write your final answer "
    "on the last line of your response, in the form 'ANSWER: X' where X is one of A, B, C or D.\n\n"
    "{question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}"
)


def gpqa_shuffle(item_id: str, correct: str, incorrect: list[str], seed: int) -> tuple[list[str], str]:
    """Deterministic per-item order of the four choices; returns (choices, correct letter)."""
    choices = [correct] + list(incorrect)
    if len(choices) != 4:
        raise ValueError("GPQA item %s has %d choices, expected 4" % (item_id, len(choices)))
    rng = random.Random(sha256_text("%d:%s" % (seed, item_id)))
    order = list(range(4))
    rng.shuffle(order)
    shuffled = [choices[i] for i in order]
    return shuffled, LETTERS[order.index(0)]


def gpqa_prompt(question: str, choices: list[str]) -> str:
    return GPQA_TEMPLATE.format(question=question.strip(), **{L: c.strip() for L, c in zip(LETTERS, choices)})


# What reasoning models really end with, read at least as leniently as the public harnesses
# (simple-evals' `answer\s*:\s*\(?([A-D])`) without taking a letter the response did not commit to:
#   ANSWER: C | **ANSWER: C** | **Answer:** C | Answer: **(C)** | answer : (d) | Answer: Option C
#   ... so the answer is B. | The final answer is **D** | $\boxed{C}$ | \boxed{\text{(B)}}
# Never: "I think it's B", "ANSWER: B or C", "the answer is a bit unclear", "ANSWER: X" (the template).
_E = r"[\s*_`]*"                                   # markdown emphasis and spacing around label and letter
_OPTION = r"(?:(?i:option|choice)\s+)?"
_NOT_ALTERNATIVE = r"(?![\s*_]*(?:or|and|/|,|&)\s*\(?[A-Da-d]\b)"
# The letter itself: upper case; lower case only where nothing else can be meant, "(d)" or "d" ending a line.
_LETTER = (r"(?:\(" + _E + r"([A-Da-d])" + _E + r"\)|\[([A-Da-d])\]|([A-D])(?![A-Za-z0-9])|([a-d])(?=[\s*_.]*$))"
           + _NOT_ALTERNATIVE)
_LABELLED = re.compile(r"(?i:answer)" + _E + r":" + _E + _OPTION + _LETTER, re.M)
_STATED = re.compile(r"(?i:answer)\s+(?i:is)" + _E + r":?" + _E + _OPTION + _LETTER, re.M)


def _letter(match) -> str:
    return next(g for g in match.groups() if g).upper()


def boxed_letter(content: str) -> str | None:
    """A choice letter in the last \\boxed{}: \\boxed{C}, \\boxed{(C)}, \\boxed{\\text{C}}, \\boxed{\\textbf{C}}."""
    boxed = last_boxed(content)
    if boxed is None:
        return None
    inner = re.sub(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", boxed)
    inner = re.sub(r"[\s()*$]", "", inner)
    return inner.upper() if re.fullmatch(r"[A-Da-d]", inner) else None


def _letter_candidates(content: str) -> list[tuple[int, str]]:
    found = [(m.start(), _letter(m)) for pattern in (_LABELLED, _STATED) for m in pattern.finditer(content)]
    boxed = boxed_letter(content)
    if boxed:
        found.append((max(content.rfind("\\boxed"), content.rfind("\\fbox")), boxed))
    return sorted(found)


def gpqa_extract(content: str) -> str | None:
    """The last answer the response commits to (labelled, stated or boxed)."""
    found = _letter_candidates(content or "")
    return found[-1][1] if found else None


# --- LongBench v2 ---------------------------------------------------------------------------------

# The official zero-shot template of LongBench v2 (THUDM/LongBench, prompts/0shot.txt).
LONGBENCH_TEMPLATE = (
    "Please read the following text and answer the question below.\n\n"
    "<text>\n{context}\n</text>\n\n"
    "What is the correct answer to this question: {question}\n"
    "Choices:\n(A) {A}\n(B) {B}\n(C) {C}\n(D) {D}\n\n"
    "Format your response as follows: \"The correct answer is (insert answer here)\"."
)

# The official scorer's two patterns (on the response with '*' removed), first match; also in any
# case, with a colon or "option" before the letter.
_LB_PAREN = re.compile(r"(?i:the\s+correct\s+answer\s+is)\s*:?\s*" + _OPTION + r"\(\s*([A-Da-d])\s*\)")
_LB_BARE = re.compile(r"(?i:the\s+correct\s+answer\s+is)\s*:?\s*" + _OPTION + r"([A-D])(?![A-Za-z0-9])"
                      + _NOT_ALTERNATIVE)


def estimate_tokens(text: str) -> int:
    """Rough token count without a tokenizer: ~4 ASCII characters per token, 1 token per other character."""
    ascii_chars = len(text.encode("ascii", "ignore"))
    return ascii_chars // 4 + (len(text) - ascii_chars)


def truncate_middle(text: str, max_tokens: int) -> str:
    """Keep the beginning and the end, drop the middle (as the official LongBench scripts do)."""
    if max_tokens <= 0 or estimate_tokens(text) <= max_tokens:
        return text
    lo, hi = 0, len(text) // 2  # characters kept at each end
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_tokens(text[:mid] + text[-mid:]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + text[-lo:] if lo else ""


def longbench_prompt(context: str, question: str, choices: list[str], max_context_tokens: int = 0) -> str:
    context = truncate_middle(context, max_context_tokens)
    return LONGBENCH_TEMPLATE.format(context=context, question=question.strip(),
                                     **{L: c.strip() for L, c in zip(LETTERS, choices)})


def longbench_extract(content: str) -> str | None:
    """The official "The correct answer is (X)" (first match); else the last committed answer."""
    text = (content or "").replace("*", "")
    m = _LB_PAREN.search(text) or _LB_BARE.search(text)
    if m:
        return m.group(1).upper()
    found = _letter_candidates(text)
    return found[-1][1] if found else None


def letter_correct(extracted: str | None, reference: str) -> bool:
    return extracted is not None and extracted == reference.strip().upper()
