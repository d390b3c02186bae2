"""Answer extraction and prompt building (pdctl.gates.prompts)."""
from __future__ import annotations

import pytest

from pdctl.gates import prompts as p


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{42}.", "42"),
    ("first \\boxed{1} then \\boxed{17}", "17"),  # the LAST box counts
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces are balanced
    ("\\boxed{ \\text{033} }", " \\text{033} "),
    ("\\boxed {7}", "7"),
    ("\\fbox{9}", "9"),
    ("good \\boxed{5} then broken \\boxed{6", "5"),  # an unclosed last box falls back to the previous one
    ("no box here: 42", None),
    ("", None),
    (None, None),
])
def test_last_boxed(text, expected):
    assert p.last_boxed(text) == expected


@pytest.mark.parametrize("answer, value", [
    ("42", 42), ("033", 33), ("$33$", 33), ("\\text{33}", 33), ("1,000", 1000), ("33.0", 33),
    ("90^\\circ", 90), ("x = 3", None), ("\\frac{1}{2}", None), ("", None), ("3.5", None),
])
def test_normalize_integer(answer, value):
    assert p.normalize_integer(answer) == value


def test_aime_grading():
    assert p.aime_correct(p.aime_extract("thus \\boxed{070}"), "70")
    assert not p.aime_correct(p.aime_extract("thus \\boxed{71}"), "70")
    assert not p.aime_correct(p.aime_extract("no answer"), "70")
    assert not p.aime_correct(p.aime_extract("\\boxed{\\frac{7}{1}}"), "7")


@pytest.mark.parametrize("text, letter", [
    ("ANSWER: B", "B"),
    ("Answer: A\n...on reflection...\nANSWER: C", "C"),  # multiple ANSWER lines: the last wins
    ("answer : (d)", "D"),
    ("The final Answer:(A)", "A"),
    ("I think it's B", None),
    ("ANSWER: E", None),
    ("", None),
])
def test_gpqa_extract(text, letter):
    assert p.gpqa_extract(text) == letter


def test_gpqa_shuffle_is_deterministic_and_tracks_the_correct_choice():
    choices, letter = p.gpqa_shuffle("rec1", "right", ["w1", "w2", "w3"], seed=5)
    assert sorted(choices) == ["right", "w1", "w2", "w3"]
    assert choices["ABCD".index(letter)] == "right"
    assert p.gpqa_shuffle("rec1", "right", ["w1", "w2", "w3"], seed=5) == (choices, letter)
    letters = {p.gpqa_shuffle("rec%d" % i, "right", ["w1", "w2", "w3"], seed=5)[1] for i in range(40)}
    assert letters == set("ABCD")  # the correct answer is not always in the same place
    prompt = p.gpqa_prompt("Q?", choices)
    assert prompt.endswith("D) %s" % choices[3]) and "ANSWER: X" in prompt


@pytest.mark.parametrize("text, letter", [
    ("The correct answer is (B)", "B"),
    ("**The correct answer is (C)**", "C"),
    ("The correct answer is D.", "D"),
    ("The correct answer is (A). Wait, The correct answer is (B)", "A"),  # the official scorer takes the first
    ("It is (A)", None),
])
def test_longbench_extract(text, letter):
    assert p.longbench_extract(text) == letter


def test_longbench_template_and_middle_truncation():
    prompt = p.longbench_prompt("doc", "Q?", ["a", "b", "c", "d"])
    assert prompt.startswith("Please read the following text and answer the question below.\n\n<text>\ndoc\n</text>")
    assert prompt.endswith('Format your response as follows: "The correct answer is (insert answer here)".')
    text = "HEAD " + "x" * 4000 + " TAIL"
    cut = p.truncate_middle(text, 100)
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and p.estimate_tokens(cut) <= 100
    assert p.truncate_middle("short", 100) == "short"
