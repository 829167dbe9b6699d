"""Over-sharpening as the paper defines it, measured exactly where every correct mode can be listed.

Definition 2.1 (Section 2.1): an updated policy over-sharpens at a query q when the probability of any correct
mode falls relative to the reference, pi_new(o|q) < pi_ref(o|q) for some o in O+ (moderate sharpening: none
falls). In the countdown task (``calibrl.data.countdown``) a problem's correct modes are its canonical solutions
(``verifier.solutions``), so each mode's probability under a model is computed by teacher forcing, not estimated
from samples: the sum over the ways the mode is written as the warm start teaches it (both operand orders for
``+`` and ``*``), each followed by the end of sequence. Texts the grader also accepts (anything after ``=`` or a
newline) are not counted: a lower bound on each mode's mass, the same one for every model compared.

Two readings split an over-sharpened problem in two (:data:`READINGS`): **reallocated**, a correct mode fell while
another rose (the mass moved between correct answers: the sharpening Definition 2.1 is about), and **declined**,
none rose (every correct answer lost mass, as a policy that drifts away from the task loses it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from calibrl.analysis_plan import DEFINITION_2_1
from calibrl.data.countdown import canonical, parse_expression

# torch and the model code are imported where the models are run: the report reads suppressed() without them

# the per-problem readings of Definition 2.1 a claim can count (calibrl.report.claims.problem_quantity), named in
# the analysis plan's layer, below this one, so that a plan is validated without the model code
READINGS = DEFINITION_2_1


def written(mode: str) -> list[str]:
    """The texts a canonical mode is written as: ``a+b`` and ``b+a`` (``*`` alike), ``a-b`` alone."""
    a, op, b = parse_expression(mode)
    if canonical(a, op, b) != mode:
        raise ValueError(f"{mode!r} is not a canonical countdown answer (expected {canonical(a, op, b)!r})")
    return [mode] if op == "-" or a == b else [mode, f"{b}{op}{a}"]


def sequence_logprobs(model, tokenizer, prompts: list[str], answers: list[str], batch: int = 512):
    """log pi(answer + eos | prompt) for each pair, by teacher forcing (float64 sums of the tokens' log-softmax)."""
    import torch

    from calibrl.models import encode_examples
    from calibrl.sampling import position_ids_from_mask

    out = []
    for start in range(0, len(prompts), batch):
        ids, mask, labels = encode_examples(tokenizer, prompts[start : start + batch], answers[start : start + batch])
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        target = labels[:, 1:]
        taken = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        out.append(taken.masked_fill(target == -100, 0.0).sum(-1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def mode_logprobs(model, tokenizer, records: Sequence[Mapping], template: str) -> list[dict[str, float]]:
    """Per record, ``{mode: log pi(mode | prompt)}`` over its correct modes (``verifier.solutions``)."""
    import torch

    from calibrl.tasks import format_prompt

    prompts, answers, owner = [], [], []
    for i, record in enumerate(records):
        prompt = format_prompt(record, template)
        for mode in record["verifier"]["solutions"]:
            for text in written(mode):
                prompts.append(prompt)
                answers.append(text)
                owner.append((i, mode))
    logp = sequence_logprobs(model, tokenizer, prompts, answers)
    per: list[dict[str, list]] = [{} for _ in records]
    for (i, mode), value in zip(owner, logp):
        per[i].setdefault(mode, []).append(value)
    return [{m: float(torch.logsumexp(torch.stack(v), 0)) for m, v in sorted(p.items())} for p in per]


def measurable(records: Sequence[Mapping]) -> bool:
    """Whether every record lists its correct modes (the countdown task; not a math benchmark)."""
    return bool(records) and all((r.get("verifier") or {}).get("solutions") for r in records)


def suppressed(new: Mapping[str, float], ref: Mapping[str, float], factor: float = 1.0) -> float:
    """The share of a problem's correct modes whose probability fell from ``ref`` to below ``factor`` times it (log
    probabilities; Definition 2.1 with ``factor`` 1: the problem is over-sharpened when it is above 0; a plan may
    ask for a fall below a fraction of the reference, so that a mode that merely jitters is not counted)."""
    if set(new) != set(ref):
        raise ValueError(f"the models were measured on different modes: {sorted(new)} vs {sorted(ref)}")
    if not 0 < factor <= 1:
        raise ValueError(f"factor must be in (0, 1], got {factor}")
    return sum(new[m] < ref[m] + math.log(factor) for m in ref) / len(ref)


def reading(kind: str, new: Mapping[str, float], ref: Mapping[str, float], factor: float = 1.0) -> bool:
    """Whether a problem is ``kind`` (:data:`READINGS`): over-sharpened (some correct mode below ``factor`` times
    its reference probability), and of those, reallocated (another correct mode above its reference) or declined
    (none above it)."""
    fell = suppressed(new, ref, factor) > 0
    if kind == "oversharpened":
        return fell
    rose = any(new[m] > ref[m] for m in ref)  # a fallen mode is below its reference: "another" is implied
    if kind == "reallocated":
        return fell and rose
    if kind == "declined":
        return fell and not rose
    raise ValueError(f"unknown reading {kind!r}: one of {READINGS}")
