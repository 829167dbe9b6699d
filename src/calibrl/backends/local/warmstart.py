"""Warm start: supervised fine-tuning of a freshly built tiny Qwen3 on sampled correct solutions.

Every epoch draws a new random correct answer (and operand order) for each training problem, so the
resulting reference policy spreads its mass over several solution modes per prompt: the starting
point the paper's analysis assumes (Section 1: SFT provides a rich manifold of reasoning modes).
The loss covers the answer tokens only. The info file beside the model records its weights' hash and the machine
that made it (``calibrl.provenance``): the same machine remakes the same weights, another one only similar ones.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch

from calibrl import provenance
from calibrl.data.countdown import sample_solution
from calibrl.io import write_json
from calibrl.logs import Progress
from calibrl.models import build_model, build_tokenizer, encode_examples, save
from calibrl.sampling import position_ids_from_mask
from calibrl.tasks import format_prompt

log = logging.getLogger("calibrl.warmstart")


def warmstart(
    records: list[dict],
    arch: dict,
    steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    seed: int,
    template: str,
    out_dir: str | Path,
) -> dict:
    """Build a model of architecture ``arch``, fit it to sampled correct answers, save it in HF format."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=seed, **arch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)  # every parameter (scope all)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * i / steps)).item())
    )
    n_params = sum(p.numel() for p in model.parameters())
    log.info("warm start: %d parameters, %d steps x %d examples", n_params, steps, batch_size)
    progress = Progress("warm-start steps", steps, log, every=10.0)
    order: list[int] = []
    loss_ema = None
    for _ in range(steps):
        if len(order) < batch_size:
            fresh = list(range(len(records)))
            rng.shuffle(fresh)
            order += fresh
        batch = [records[i] for i in order[:batch_size]]
        del order[:batch_size]
        prompts = [format_prompt(r, template) for r in batch]
        answers = [sample_solution(r, rng) for r in batch]
        ids, mask, labels = encode_examples(tokenizer, prompts, answers)
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), labels=labels)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss = out.loss.item()
        loss_ema = loss if loss_ema is None else 0.95 * loss_ema + 0.05 * loss
        progress.update(note=f"loss={loss_ema:.3f}")
    model.eval()
    save(model, tokenizer, out_dir)
    info = {"parameters": n_params, "final_loss_ema": loss_ema, "steps": steps, "arch": arch,
            "weights_sha256": provenance.weights_sha256(out_dir), "machine": provenance.machine()}  # fmt: skip
    write_json(Path(out_dir).parent / f"{Path(out_dir).name}.json", info)
    return info


def warmstart_job(params: dict, sft_path: str, model_dir: str, info_path: str, threads: int = 1) -> None:
    """Rule warmstart's job: the supervised warm start of a tiny model (``params``: ``grid.warmstart_params``)."""
    from calibrl.data.records import read_jsonl

    torch.set_num_threads(max(1, int(threads)))  # Snakemake runs jobs side by side
    ws = params["warmstart"]
    records = read_jsonl(sft_path, on_error=params["on_error"])
    info = warmstart(
        records, params["arch"], ws["steps"], ws["batch_size"], ws["lr"], ws["weight_decay"], params["seed"],
        params["template"], model_dir,
    )  # fmt: skip
    write_json(info_path, {**info, "model": params["model"], "path": str(Path(model_dir).resolve())})
