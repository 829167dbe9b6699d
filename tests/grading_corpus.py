"""A generated corpus of (response, gold) pairs for differential tests of calibrl.grading against
math-verify, and the oracle: ``math_verify.verify(parse(gold_latex(gold)), parse(response))`` with
math-verify's defaults, computed in plain worker processes (stock math-verify, none of the Grader's code
but :func:`calibrl.grading.gold_latex`, the project's documented way of handing math-verify a gold answer).

The corpus aims at the places where an answer extractor can go wrong (learned from math-verify's parser and
its test suite, written anew here): answer cues followed by prose and units, empty and several boxes,
hedges, self-corrections, ``<think>`` blocks, intervals, sets, tuples, fractions, decimals, percentages,
degrees, text answers, huge integers, leading zeros and thousands separators, each rendered right or wrong.
"""

from __future__ import annotations

import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor

# Answer families: (gold as a benchmark writes it, ways a model writes the same value, wrong values).
FAMILIES: list[tuple[str, list[str], list[str]]] = [
    ("18", ["18", "18.0", "018", "18.00", "\\$18", "18 dollars", "{18}"], ["17", "19", "180", "1.8"]),
    ("-7", ["-7", "-7.0", "- 7", "(-7)"], ["7", "-6", "-70"]),
    ("0", ["0", "0.0", "000", "-0"], ["1", "0.1", "O"]),
    ("1000", ["1000", "1,000", "1{,}000", "1\\,000", "1 000", "1000.0", "10^3"], ["100", "1001", "10,000"]),
    ("2552004", ["2552004", "2,552,004", "2 552 004"], ["2552005", "2,552,04"]),
    ("004", ["004", "4", "04", "4.0"], ["40", "400", "5"]),
    ("12345678901234567890", ["12345678901234567890", "12345678901234567890.0"], ["12345678901234567891"]),
    (
        "\\frac{1}{2}",
        ["\\frac{1}{2}", "\\dfrac{1}{2}", "\\tfrac12", "1/2", "0.5", ".5", "0.50", "\\frac{2}{4}"],
        ["\\frac{1}{3}", "0.51", "2", "\\frac{2}{1}"],
    ),
    (
        "\\frac{9}{7}",
        ["\\frac{9}{7}", "\\dfrac{9}{7}", "9/7", "1\\frac{2}{7}", "\\frac{18}{14}"],
        ["\\frac{7}{9}", "1.28"],
    ),
    ("0.75", ["0.75", "\\frac{3}{4}", "3/4", "75\\%", ".75"], ["0.7", "\\frac{4}{3}", "7.5"]),
    ("50\\%", ["50\\%", "50%", "50 percent", "0.5", "50", "\\frac{1}{2}"], ["5\\%", "40\\%", "0.05"]),
    ("30^\\circ", ["30^\\circ", "30^{\\circ}", "30°", "30", "30 degrees", "\\frac{\\pi}{6}"], ["60^\\circ", "31"]),
    (
        "\\sqrt{2}",
        ["\\sqrt{2}", "2^{1/2}", "\\sqrt2", "1.41421356", "\\frac{2}{\\sqrt{2}}"],
        ["2", "\\sqrt{3}", "1.41"],
    ),
    ("2\\sqrt{3}", ["2\\sqrt{3}", "\\sqrt{12}", "2 \\sqrt 3"], ["3\\sqrt{2}", "\\sqrt{6}"]),
    ("\\pi", ["\\pi", "3.14159265", "\\frac{2\\pi}{2}"], ["3.14", "2\\pi", "\\pi^2"]),
    ("\\frac{\\pi}{4}", ["\\frac{\\pi}{4}", "\\pi/4", "0.25\\pi", "45^\\circ"], ["\\frac{\\pi}{3}", "\\pi"]),
    ("(1, 2]", ["(1, 2]", "(1,2]", "\\left(1, 2\\right]", "1 < x \\le 2"], ["[1, 2]", "(1, 2)", "(2, 1]"]),
    ("[0, \\infty)", ["[0, \\infty)", "[0,\\infty)", "x \\ge 0", "[0, +\\infty)"], ["(0, \\infty)", "[1, \\infty)"]),
    ("(-\\infty, -1) \\cup (1, \\infty)", ["(-\\infty,-1)\\cup(1,\\infty)", "|x| > 1"], ["(-1, 1)", "(1, \\infty)"]),
    (
        "\\{1, 2\\}",
        ["\\{1, 2\\}", "\\{2, 1\\}", "1, 2", "1 and 2", "2, 1", "\\{1,2\\}"],
        ["\\{1, 3\\}", "\\{1\\}", "1, 2, 3"],
    ),
    ("2, 3", ["2, 3", "3, 2", "2 \\text{ and } 3", "x = 2, 3"], ["2", "3", "2, 4"]),
    (
        "(3, \\frac{\\pi}{2})",
        ["(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"],
        ["(\\frac{\\pi}{2}, 3)", "(3, \\pi)", "3"],
    ),
    ("(1, -2)", ["(1, -2)", "(1,-2)", "x = 1, y = -2"], ["(-2, 1)", "(1, 2)"]),
    ("x^2 + 1", ["x^2 + 1", "1 + x^2", "x^{2}+1", "(x^2+1)"], ["x^2 - 1", "x^2", "y^2 + 1"]),
    ("2x + 3", ["2x + 3", "3 + 2x", "2 x+3", "y = 2x + 3"], ["2x - 3", "3x + 2"]),
    ("x = 5", ["x = 5", "5", "x=5"], ["x = 6", "y = 5", "-5"]),
    (
        "\\text{Monday}",
        ["\\text{Monday}", "Monday", "\\textbf{Monday}", "\\mathrm{Monday}"],
        ["\\text{Tuesday}", "monday"],
    ),
    ("\\text{(C)}", ["\\text{(C)}", "(C)", "C"], ["\\text{(B)}", "B"]),
    (
        "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
        ["\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"],
        ["\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}"],
    ),
    ("5\\text{ cm}", ["5\\text{ cm}", "5 cm", "5", "5\\,\\text{cm}", "50 mm"], ["6 cm", "0.5"]),
    ("10\\%", ["10\\%", "10%", "0.1", "10"], ["1\\%", "0.01"]),
    ("3.14", ["3.14", "3.140", "\\frac{314}{100}", "3,14"], ["3.15", "31.4"]),
    ("-\\frac{3}{2}", ["-\\frac{3}{2}", "-1.5", "\\frac{-3}{2}", "-3/2"], ["\\frac{3}{2}", "-\\frac{2}{3}"]),
    ("\\infty", ["\\infty", "+\\infty", "\\infty."], ["-\\infty", "0"]),
    ("e^{2}", ["e^2", "e^{2}", "\\exp(2)", "7.3890561"], ["2e", "e^3"]),
    ("\\$18.90", ["\\$18.90", "18.90", "18.9", "\\$18.9"], ["\\$19", "18.09"]),
    ("7", ["7", "seven", "\\text{seven}", "7.", "7,"], ["8", "77"]),
    ("\\frac{1}{4}", ["\\frac{1}{4}", "\\frac{1}{4}.", "0.25", "25\\%"], ["\\frac{1}{5}", "4"]),
]

# Response templates: {a} is the answer as written, {b} another answer (a hedge, or an earlier attempt).
TEMPLATES = [
    "\\boxed{{{a}}}",
    "So the result is $\\boxed{{{a}}}$.",
    "Therefore the final answer is $\\boxed{{{a}}}$.",
    "The final answer is ${a}$. I hope it is correct.",
    "The final answer is {a}",
    "The answer is {a}.",
    "The answer is {a} dollars.",
    "So the answer is {a}, as required.",
    "The answer is: {a} eggs",
    "Answer: {a} (after checking the arithmetic)",
    "**Answer:** {a}",
    "**Final Answer**\n\\boxed{{{a}}}",
    "${a}$",
    "\\[{a}\\]",
    "We get \\({a}\\) in the end.",
    "Thus x = {a}.",
    "{a}",
    "\\boxed{{{a}}}\n\nWait, let me double-check: \\boxed{{}}",
    "\\boxed{{{a}}} and \\boxed{{{b}}}",
    "The answer is either \\boxed{{{b}}} or \\boxed{{{a}}}.",
    "The answer is {b}. Wait, no. The answer is {a}.",
    "First I got \\boxed{{{b}}}, but that is wrong; the correct value is \\boxed{{{a}}}.",
    "The final answer is \\boxed{{{a}}}. Hmm, the answer is {b}?",
    "The answer is {b}, so the final answer is $\\boxed{{{a}}}$",
    "\\boxed{{{a}.}}",
    "\\boxed{{{a} \\text{{ units}}}}",
    "\\fbox{{{a}}}",
    "\\boxed{{\\text{{{a}}}}}",
    "\\boxed{{x = {a}}}",
    "$$\\boxed{{{a}}}$$ is what we get, not ${b}$.",
    "The values are ${b}$ and ${a}$.",
    "We have $y = {b}$, hence $y = {a}$",
    "\\boxed{{{a}}} \\boxed{{}}",
    "The answer is \\boxed{{",
    "\\boxed{{{a}}}. Then, the answer is {b} or so.",
]

THINKING = [
    "",
    "Let me think step by step. ",
    "<think>\nThe sum is 12 + 6 = 18, and 18 / 2 = 9. Maybe the answer is {b}?\n</think>\n\n",
    "<think>\nHmm. Try $x = {b}$. That fails, so try again.\n</think>\n",
    "We compute $2 + 3 = 5$ and then $5 \\cdot 4 = 20$. ",
    "Step 1: note that {b} is a candidate.\nStep 2: check it.\n",
    "First, 1,234 apples cost $3.50 each; 25% are gone. ",
]

TRAILERS = ["", "", " Done.", "\n\nI hope this helps!", " (units: cm)", ".", "\n"]


def covering(seed: int = 0) -> list[tuple[str, str]]:
    """Every (family, answer as written, template) once: each right and wrong rendering of each family and one other
    family's gold, in every template; the reasoning before, the words after and the hedge ``{b}`` drawn with
    ``seed``: (251 + 38) x 35 pairs. A random draw of 20,000 pairs (this corpus before) reached 84% of the 8,785
    (rendering, template) combinations; this reaches all of them at half the cost. Pairs come grouped by (gold,
    answer written), as a policy's samples for one problem repeat answers: math-verify's own small parse caches
    then work for the oracle as they do in real use (they are pure, so the order changes no verdict)."""
    rng = random.Random(seed)
    out = []
    for gold, right, wrong in FAMILIES:
        for a in [*right, *wrong, None]:
            for template in TEMPLATES:
                written = rng.choice([f[0] for f in FAMILIES if f[0] != gold]) if a is None else a
                b = rng.choice(wrong + right + [rng.choice(FAMILIES)[0]])
                think = rng.choice(THINKING).replace("{b}", b)
                out.append((gold, written, think + template.format(a=written, b=b) + rng.choice(TRAILERS)))
    out.sort(key=lambda t: (t[0], t[1]))
    return [(text, gold) for gold, _, text in out]


def oracle_one(pair: tuple[str, str]) -> bool:
    """math-verify's verdict on one pair, as its README writes the call, with its default settings."""
    from math_verify import parse, verify

    from calibrl.grading import gold_latex

    response, gold = pair
    return bool(verify(parse(gold_latex(gold)), parse(response)))


def oracle_chunk(pairs: list[tuple[str, str]]) -> list[bool]:
    return [oracle_one(p) for p in pairs]


def oracle(pairs: list[tuple[str, str]], workers: int = 2, chunk: int = 250) -> list[bool]:
    """The oracle's verdicts, computed in ``workers`` fresh processes (spawned: stock math-verify state)."""
    ctx = multiprocessing.get_context("spawn")
    chunks = [pairs[i : i + chunk] for i in range(0, len(pairs), chunk)]
    with ProcessPoolExecutor(workers, mp_context=ctx) as ex:
        return [v for part in ex.map(oracle_chunk, chunks) for v in part]


def disagreements(pairs, grades, expected) -> list[str]:
    """One line per pair where the Grader and math-verify differ, naming the input."""
    return [
        f"response={r!r} gold={g!r}: math-verify says {want}, Grader says {got.correct} ({got})"
        for (r, g), got, want in zip(pairs, grades, expected)
        if got.correct != want
    ]
