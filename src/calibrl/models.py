"""Tiny Qwen3-architecture causal LMs and their character-level tokenizer.

The policy ``pi_theta`` and DLC's memory network ``m_phi`` (Section 3.2) are both ``Qwen3ForCausalLM``
models trained from scratch on the synthetic arithmetic task; they share one tokenizer, so their
next-token logits live on the same vocabulary and ``f_theta - mu * f_phi`` is well defined.

Checkpoints are plain ``save_pretrained`` directories and are read back through
``AutoModelForCausalLM`` / ``AutoTokenizer`` with ``local_files_only=True``: the code path a real Qwen3
checkpoint goes through, with nothing fetched from any hub.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import string
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.utils import logging as hf_logging

from calibrl.io import share

# transformers' save_pretrained imports DeepSpeed where installed (through accelerate), which warns "Setting
# accelerator to CPU" in every job: these tiny models train and sample on CPU only, so name it (without asking
# CUDA, which would initialise it in the job server before it forks).
os.environ.setdefault("DS_ACCELERATOR", "cpu")

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
CHARACTERS = tuple(string.digits) + tuple("+-*/=><().,: ") + tuple(string.ascii_lowercase)

# SDPA: on CPU it is faster than "eager" for these models (fewer Python-level ops per layer), it is
# exact against eager at the real positions, and transformers' SDPA mask keeps the fully masked
# query rows of left padding finite, so no NaN leaks from pad positions.
ATTN_IMPLEMENTATION = "sdpa"


@contextlib.contextmanager
def _no_progress_bars():
    """Silence transformers' per-shard tqdm bars (they would flood the workflow logs), then restore."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: ``<pad> <bos> <eos> <unk>`` then one token per allowed character.

    Every character is its own pre-token (a one-character regex split) and is looked up in a
    WordLevel vocabulary; characters outside it map to ``<unk>``. The ``Fuse`` decoder joins tokens
    with no separator, so ``decode(encode(s)) == s`` for strings over the vocabulary. The tokenizer
    adds no special tokens by itself: the sampler and trainers prepend ``<bos>`` explicitly.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Oniguruma's (?m) is "dot matches newline", so even "\n" becomes one (unknown) token.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,  # the default clean-up would turn "3 ," into "3,"
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 64,
    seed: int = 0,
) -> Qwen3ForCausalLM:
    """A freshly initialised tiny ``Qwen3ForCausalLM`` (eval mode), identical for identical arguments.

    Initialisation draws from a forked RNG seeded with ``seed``, so the global torch RNG is untouched.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation=ATTN_IMPLEMENTATION,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.eval()


def save(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, path: str | Path) -> Path:
    """``save_pretrained`` model and tokenizer into ``path``, which appears complete or not at all.

    Both are written into a temporary sibling directory that is then renamed onto ``path``. An
    existing checkpoint at ``path`` is first moved aside and deleted only after the new one is in
    place, so a crash leaves either the old or the new checkpoint (plus a hidden leftover).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        with _no_progress_bars():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        for part in (tmp, *tmp.iterdir()):  # mkdtemp's 0700 and safetensors' 0600 whatever the umask
            share(part)
        if not path.exists():
            os.replace(tmp, path)
            return path
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
        os.replace(path, old / path.name)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old / path.name, path)  # put the previous checkpoint back
            raise
        shutil.rmtree(old, ignore_errors=True)
        return path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(path: str | Path) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """Load a checkpoint written by :func:`save` through the Auto classes, offline, in eval mode."""
    path = str(path)
    with _no_progress_bars():
        try:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        except Exception as exc:
            if type(exc).__name__ != "SafetensorError":
                raise
            raise CheckpointUnreadable(path, exc) from exc
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer


class CheckpointUnreadable(RuntimeError):
    """A saved model whose weights cannot be read (a truncated or corrupt ``model.safetensors``)."""

    def __init__(self, path: str, cause: Exception):
        step = re.search(r"(?:^|/)(?:global_)?step_?(\d+)(?:_hf)?(?:/|$)", path)
        what = f"the checkpoint of step {step.group(1)}" if step else "this model"
        super().__init__(
            f"{path}/model.safetensors cannot be read ({cause}): {what} is truncated or corrupt (a full disk, a copy "
            f"cut short). Fix: delete {path} and rerun the job that wrote it (a training job resumes from the "
            "newest checkpoint left)"
        )
        self.path = path


def encode_examples(tokenizer, prompts: list[str], answers: list[str]) -> tuple[torch.Tensor, ...]:
    """Left-padded ``<bos> prompt answer <eos>`` rows, their attention mask and answer-only labels.

    One tokenizer call per list and one tensor per output: the warm start encodes a batch every step, and per-row
    calls took 8% of its step (``benchmarks/warmstart_encoding.py``)."""
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    answer_ids = [a + [eos] for a in tokenizer(list(answers), add_special_tokens=False)["input_ids"]]
    seqs = [[bos, *p, *a] for p, a in zip(prompt_ids, answer_ids)]
    width = max(len(seq) for seq in seqs)
    ids = torch.tensor([[pad] * (width - len(seq)) + seq for seq in seqs], dtype=torch.long)
    mask = torch.tensor([[False] * (width - len(seq)) + [True] * len(seq) for seq in seqs], dtype=torch.bool)
    labels = torch.tensor([[-100] * (width - len(a)) + a for a in answer_ids], dtype=torch.long)
    return ids, mask, labels
