"""Answer extraction and prompt building (plugin_utils.gates.prompts)."""
from __future__ import annotations

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import prompts as p


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


# ---------------------------------------------------------------- issue 13 item 10: real endings

REASONING = ("Let me work through the options. Option A ignores the spin-orbit term, and B double counts the\n"
             "degeneracy. Between C and D, the selection rule favours C.\n\n")


@pytest.mark.parametrize("ending, letter", [
    ("ANSWER: C", "C"),
    ("**ANSWER: C**", "C"),
    ("**Answer:** C", "C"),
    ("**ANSWER**: C", "C"),
    ("ANSWER: **C**", "C"),
    ("Answer: **(C)**", "C"),
    ("*Answer*: _C_", "C"),
    ("Answer: [C]", "C"),
    ("Answer: Option C", "C"),
    ("Final answer: C) 2.4 eV", "C"),
    ("So the answer is C.", "C"),
    ("Therefore, the answer is **C**, since the transition is allowed.", "C"),
    ("the final answer is (c)", "C"),
    ("Hence the answer is: C", "C"),
    ("$\\boxed{C}$", "C"),
    ("The answer is $\\boxed{\\text{C}}$.", "C"),
    ("\\boxed{(C)}", "C"),
    ("ANSWER: \\boxed{C}", "C"),
    ("Answer: A\n\nWait, I mis-read the units.\n\nANSWER: C", "C"),    # the last commitment wins
    ("answer: c", "C"),                                                   # lower case ending the line
])
def test_gpqa_reads_the_endings_reasoning_models_write(ending, letter):
    assert p.gpqa_extract(REASONING + ending) == letter


@pytest.mark.parametrize("ending", [
    "I think it's C, but I'm not sure.",
    "ANSWER: B or C",
    "ANSWER: B/C",
    "The answer is either B or C.",
    "The answer is a bit subtle, so let me stop here.",
    "The answer is not obvious.",
    "Write your final answer in the form 'ANSWER: X'.",
    "\\boxed{2.4\\text{ eV}}",
])
def test_gpqa_takes_no_letter_the_response_did_not_commit_to(ending):
    assert p.gpqa_extract(REASONING.replace("Option A", "The first option").replace("Between C and D", "Between the last two")
                           .replace("and B double", "and the second double").replace("favours C", "favours the third")
                           + ending) is None


@pytest.mark.parametrize("text, letter", [
    ("the correct answer is (B)", "B"),
    ("The correct answer is: (C)", "C"),
    ("The correct answer is option D.", "D"),
    ("**The correct answer is (b)**", "B"),
    ("After reading the report, I conclude **(A)**.\n\nFinal answer: **A**", "A"),
    ("$\\boxed{B}$", "B"),
])
def test_longbench_reads_real_endings(text, letter):
    assert p.longbench_extract(text) == letter


@pytest.mark.parametrize("text, value", [
    ("The sum is 70.\n\n**Final Answer:** $\\boxed{70}$", 70),
    ("so the count is seventy.\n\n**Final answer:** 70", 70),
    ("Therefore the answer is 204.", 204),
    ("ANSWER: 33", 33),
])
def test_aime_reads_real_endings(text, value):
    assert p.normalize_integer(p.aime_extract(text)) == value


@pytest.mark.parametrize("text", [
    "We get 70 so far, then 204 after the second step.",     # numbers, but no committed answer
    "The answer is 3.5 before rounding",
    "the answer is 1/2",
])
def test_aime_takes_no_number_the_response_did_not_commit_to(text):
    assert p.normalize_integer(p.aime_extract(text) or "") is None
