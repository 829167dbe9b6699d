"""What the CPU rehearsal (config/rehearsal.yaml) needs and a site would download: two tiny Qwen3 models saved as a
Hub download with a lock entry, and small slices of the real data sets in their upstream formats.

``python tests/rehearsal_setup.py [RESULTS]`` (default ``results/rehearsal``) writes, no network:

* ``RESULTS/hub_models/calibrl--tiny-qwen3-{policy,memory}/main/`` (``grid.models_dir``): ``Qwen3ForCausalLM``
  folders with a byte-level tokenizer and a ChatML template, each marked complete at a made-up commit, as
  ``download_model`` leaves a download, and ``RESULTS/models.lock.yaml`` (``grid.models_lock``) naming it. The
  policy is warm-started to answer ``\\boxed{1}`` or ``\\boxed{2}``, so about half its samples on the training
  slice (DeepScaleR rows whose answer is 1 or 2) are correct and DAPO's dynamic sampling finds mixed groups.
* ``RESULTS/local_data/{key}.jsonl`` (``grid.data.local_files``): DeepScaleR's rows from ``../shared/data`` and
  the first rows of each benchmark, written back in the Hub copy's columns so that the real normalisers read them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
POLICY, MEMORY = "calibrl/tiny-qwen3-policy", "calibrl/tiny-qwen3-memory"
COMMITS = {POLICY: "7e" * 20, MEMORY: "3a" * 20}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
TRAIN_ANSWERS = ("1", "2")
MAX_PROBLEM_CHARS = 160  # short problems: prompts well inside max_prompt_len
# trainer -> the results folder of its rehearsal, once it finished in this pytest process: the cross-trainer check
# (tests/test_rehearsal_verl.py) compares the two
FINISHED: dict[str, Path] = {}


def tokenizer():
    """A byte-level tokenizer (every text encodes; 256 byte tokens, no merges) with Qwen3's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)
    fast.add_special_tokens(
        {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]}
    )
    fast.chat_template = CHATML
    fast.padding_side = "left"
    return fast


def model(tok, hidden: int, layers: int, heads: int, seed: int):
    """A tiny Qwen3 (head size 64: vLLM's CPU attention supports it), float32."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,  # the longest benchmark prompt + response, byte tokens
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def warm_start(net, tok, problems: list[str], steps: int = 60, seed: int = 0) -> float:
    """Supervised steps on ``<prompt> \\boxed{a}<|im_end|>`` with ``a`` drawn from :data:`TRAIN_ANSWERS`, the loss
    on the response only: the model learns the answer's form, not which answer. Returns the last loss."""
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    net.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        ids, labels = [], []
        for problem in rng.sample(problems, 8):
            prompt = tok.apply_chat_template([{"role": "user", "content": problem}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)  # fmt: skip
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            r = tok(f"\\boxed{{{rng.choice(TRAIN_ANSWERS)}}}<|im_end|>", add_special_tokens=False)["input_ids"]
            ids.append(p + r)
            labels.append([-100] * len(p) + r)
        width = max(map(len, ids))
        pad = tok.pad_token_id
        x = torch.tensor([[pad] * (width - len(s)) + s for s in ids])
        y = torch.tensor([[-100] * (width - len(s)) + s for s in labels])
        mask = (torch.arange(width)[None, :] >= (width - torch.tensor([len(s) for s in ids]))[:, None]).long()
        loss = net(input_ids=x, attention_mask=mask, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    return float(loss)


def _save(net, tok, folder: Path, commit: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / ".complete").write_text(commit + "\n")


# ------------------------------------------------------------------------------------------------ data
def _shared(path: str) -> list[dict]:
    file = SHARED / path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: the rehearsal reads slices of ../shared/data (absent here)")
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


UPSTREAM = {  # key: (shared file, the Hub copy's columns from a normalised record)
    "gsm8k": ("benchmarks/gsm8k_test.jsonl", lambda r: {"question": r["problem"], "answer": f"#### {r['answer']}"}),
    "math500": ("benchmarks/math500.jsonl", lambda r: {"problem": r["problem"], "answer": r["answer"]}),
    "lighteval": ("benchmarks/math_lighteval_test.jsonl",
                  lambda r: {"problem": r["problem"], "solution": f"\\boxed{{{r['answer']}}}"}),  # fmt: skip
    "aime24": ("benchmarks/aime24.jsonl", lambda r: {"problem": r["problem"], "answer": r["answer"]}),
    "minerva": ("benchmarks/minerva_math.jsonl", lambda r: {"question": r["problem"], "answer": r["answer"]}),
    "olympiadbench": ("benchmarks/olympiadbench.jsonl",
                      lambda r: {"question": r["problem"], "final_answer": r.get("final_answer_raw") or [r["answer"]]}),
}  # fmt: skip
DEEPSCALER = (
    "deepscaler-partial/deepscaler_subset_manhitv_train.jsonl",
    "deepscaler-partial/deepscaler_partial_aime_math.jsonl",
    "deepscaler-partial/deepscaler_subset803_metareason.jsonl",
)


def train_logs(work: Path) -> dict[str, list[str]]:
    """The SLURM logs of rule train in a rehearsal's work folder, per run (``<model>_<method>_<seed>``), in submission
    order (tests/test_rehearsal.py, tests/test_rehearsal_verl.py)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for log in (work / ".snakemake" / "slurm_logs" / "rule_train").glob("**/*.log"):
        out.setdefault(log.parent.name.rsplit("_", 1)[0], []).append((int(log.stem), log.read_text(errors="replace")))
    return {k: [text for _, text in sorted(v)] for k, v in out.items()}


def segment_logs(work: Path, run: str, end: int) -> list[str]:
    """The SLURM logs of the training jobs of ``run`` (``model/method/s<seed>``) that end at step ``end``, one per
    attempt, in submission order."""
    model, method, seed = run.split("/")
    folder = work / ".snakemake" / "slurm_logs" / "rule_train" / f"{model}_{method}_{seed.removeprefix('s')}_{end}"
    return [p.read_text(errors="replace") for p in sorted(folder.glob("*.log"), key=lambda p: int(p.stem))]


def kill_leftovers(root: Path) -> list[int]:
    """SIGKILL every process of a run under ``root`` still alive (``calibrl.gpu.leftovers``); their pids. The local
    SLURM tracks a job's processes by pid, not by cgroup as a GPU site does, so a vLLM engine of a cancelled job
    (its launcher killed before it could clean up) outlives it, holding GBs of this host's memory under the next
    rehearsal: each rehearsal ends with this."""
    from calibrl.gpu import leftovers

    return leftovers.kill(root, under=True)


def train_rows() -> list[dict]:
    """DeepScaleR's short rows whose answer is 1 or 2."""
    rows = [r for path in DEEPSCALER for r in _shared(path)]
    keep = [r for r in rows if r["answer"].strip() in TRAIN_ANSWERS and len(r["problem"]) <= MAX_PROBLEM_CHARS]
    return [{"problem": r["problem"], "answer": r["answer"].strip()} for r in keep]


def write_data(folder: Path, eval_rows: int = 40) -> dict[str, str]:
    """``grid.data.local_files``: key -> file."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, (path, convert) in UPSTREAM.items():
        rows = [convert(r) for r in _shared(path)[:eval_rows]]
        out[key] = str(folder / f"{key}.jsonl")
        Path(out[key]).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    train = train_rows()
    if len(train) < 16:
        raise RuntimeError(f"only {len(train)} short DeepScaleR rows answer 1 or 2 in {SHARED}")
    out["deepscaler"] = str(folder / "deepscaler.jsonl")
    Path(out["deepscaler"]).write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    return out


def build(results: Path) -> dict:
    """Models, lock and data under ``results`` (idempotent: what exists is kept)."""
    results = Path(results)
    data = write_data(results / "local_data")
    hub = results / "hub_models"
    lock = results / "models.lock.yaml"
    problems = [r["problem"] for r in train_rows()]
    tok = tokenizer()
    for hf_id, (hidden, layers, heads, seed) in {POLICY: (128, 2, 2, 0), MEMORY: (64, 1, 1, 1)}.items():
        folder = hub / hf_id.replace("/", "--") / "main"
        if not (folder / ".complete").is_file():
            net = model(tok, hidden, layers, heads, seed)
            if hf_id == POLICY:
                warm_start(net, tok, problems)
            _save(net, tok, folder, COMMITS[hf_id])
    lock.write_text("".join(f"{hf_id}@main: '{commit}'\n" for hf_id, commit in COMMITS.items()))
    return {"models_dir": str(hub), "models_lock": str(lock), "local_files": data}


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1] if len(sys.argv) > 1 else "results/rehearsal")), indent=2))
