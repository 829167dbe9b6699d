"""Tiny Qwen3 models, the character tokenizer, and the KV-cached (DLC) rollout sampler."""

import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from calibrl.algo.dlc import calibrated_logits
from calibrl.models import build_model, build_tokenizer, encode_examples, load, save
from calibrl.sampling import encode_prompts, position_ids_from_mask, sample


@torch.no_grad()
def sampling_probs(policy, memory, mu: float, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """DLC's next-token distribution softmax(f_theta - mu f_phi) (B, V) at the last position of left-padded inputs,
    from full forward passes (the reference the KV-cache sampler is tested against)."""
    positions = position_ids_from_mask(attention_mask)
    logits = policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits[:, -1].float()
    if memory is None or mu == 0:
        return logits.softmax(dim=-1)
    mem = memory(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits[:, -1].float()
    return calibrated_logits(logits, mem, mu).softmax(dim=-1)


PROMPTS = ["3 7 12 5 -> 15", "1 2 -> 3", "10 4 6 9 2 -> 19"]  # different lengths: real left padding


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def sharpen(model, std=0.3, seed=0):
    """Re-draw the matrices with a large scale so next-token distributions are far from uniform
    (the default 0.02 init gives near-uniform logits, which would make the checks below weak)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std, generator=gen)
    return model


def boost_eos(model, tokenizer, bias=2.5):
    """Raise the <eos> logit so rows finish at different steps (exercises the finished-row logic)."""
    eos = tokenizer.eos_token_id

    def hook(module, args, out):
        out = out.clone()
        out[..., eos] += bias
        return out

    model.lm_head.register_forward_hook(hook)
    return model


def full_forward_logprobs(model, rollout):
    """Per-token log-probs of the responses from one no-cache forward over the whole sequences."""
    logits = model(
        input_ids=rollout.sequences,
        attention_mask=rollout.attention_mask,
        position_ids=position_ids_from_mask(rollout.attention_mask),
    ).logits
    P, T = rollout.prompt_len, rollout.response_mask.shape[1]
    logp = logits[:, P - 1 : P + T - 1].float().log_softmax(-1)
    return logp.gather(-1, rollout.sequences[:, P:, None]).squeeze(-1)


def tv(p, q):
    return 0.5 * (p - q).abs().sum().item()


# --- tokenizer and models ---------------------------------------------------------------------------


def test_tokenizer_round_trip_and_special_ids(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.unk_token_id is not None and tokenizer.padding_side == "left"
    for text in ["3 7 12 5 -> 15", "12+3", "(4*5)/2=10, x: y.", "a  b"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)  # one token per character, spaces included
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text
    ids = tokenizer("12+3", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode([tokenizer.bos_token_id, *ids, tokenizer.eos_token_id], skip_special_tokens=True) == "12+3"
    assert tokenizer("A?", add_special_tokens=False)["input_ids"] == [tokenizer.unk_token_id] * 2


def test_encode_examples_left_pads_bos_prompt_answer_eos_with_answer_only_labels(tokenizer):
    ids, mask, labels = encode_examples(tokenizer, ["1 2 -> 3:", "10 4 6 9 2 -> 19:"], ["1+2", "10+9"])
    rows = []
    for prompt, answer in (("1 2 -> 3:", "1+2"), ("10 4 6 9 2 -> 19:", "10+9")):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(([tokenizer.bos_token_id, *p], a))
    width = max(len(p) + len(a) for p, a in rows)
    assert ids.shape == mask.shape == labels.shape == (2, width)
    assert (ids.dtype, mask.dtype, labels.dtype) == (torch.long, torch.bool, torch.long)
    for i, (p, a) in enumerate(rows):
        pad = width - len(p) - len(a)
        assert ids[i].tolist() == [tokenizer.pad_token_id] * pad + p + a
        assert mask[i].tolist() == [False] * pad + [True] * (len(p) + len(a))
        assert labels[i].tolist() == [-100] * (pad + len(p)) + a  # the loss covers the answer and its <eos> only
    assert (~mask[0]).any() and mask[1].all()  # the shorter row is padded, the longer one not


def test_build_model_is_a_seeded_tiny_qwen3(tokenizer):
    state = torch.get_rng_state()
    a, b, c = build_model(tokenizer, seed=3), build_model(tokenizer, seed=3), build_model(tokenizer, seed=4)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is left alone
    assert isinstance(a, Qwen3ForCausalLM)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])
    cfg = a.config
    assert cfg.vocab_size == len(tokenizer) and cfg.head_dim == 16 and cfg.tie_word_embeddings
    assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)


def test_save_load_round_trip_through_auto_classes(tokenizer, tmp_path):
    model = sharpen(build_model(tokenizer, seed=1))
    path = tmp_path / "ckpt"
    save(build_model(tokenizer, seed=2), tokenizer, path)
    save(model, tokenizer, path)  # overwriting an existing checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary leftovers
    loaded, tok = load(path)
    assert type(loaded) is Qwen3ForCausalLM and isinstance(tok, PreTrainedTokenizerFast)
    assert tok.get_vocab() == tokenizer.get_vocab() and tok.padding_side == "left"
    assert tok.decode(tok("3 7 12 5 -> 15")["input_ids"]) == "3 7 12 5 -> 15"
    ids, mask = encode_prompts(tok, PROMPTS)
    kw = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    with torch.no_grad():
        assert torch.equal(model(**kw).logits, loaded(**kw).logits)


# --- sampler ----------------------------------------------------------------------------------------


def test_kv_cache_logprobs_match_a_full_forward_with_left_padding(tokenizer):
    policy = boost_eos(sharpen(build_model(tokenizer, seed=0)), tokenizer)
    r = sample(
        policy,
        tokenizer,
        PROMPTS,
        group_size=8,
        max_new_tokens=10,
        generator=torch.Generator().manual_seed(0),
    )
    B, T = r.response_mask.shape
    assert B == 24 and r.sequences.shape == (B, r.prompt_len + T) and T <= 10
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    assert mask[:, 0].tolist() == [False, False, True]  # the rows really are left-padded
    assert torch.equal(r.sequences[:, : r.prompt_len], ids.repeat_interleave(8, 0))  # groups are contiguous

    # finished rows: the mask is a prefix ending at <eos>, then only pads
    m = r.response_mask
    assert torch.equal(m, m.long().cummin(dim=1).values.bool())
    lengths = m.sum(1)
    assert 0 < (lengths < T).sum() < B  # some rows stopped early, some did not
    resp = r.responses
    for row in range(B):
        n = int(lengths[row])
        if n < T:
            assert resp[row, n - 1] == tokenizer.eos_token_id and (resp[row, n:] == tokenizer.pad_token_id).all()
    assert (r.logprobs[~m] == 0).all() and (r.entropy[~m] == 0).all()
    assert r.texts == tokenizer.batch_decode(resp.tolist(), skip_special_tokens=True)

    with torch.no_grad():
        full = full_forward_logprobs(policy, r)
    assert torch.allclose(r.logprobs[m], full[m], atol=1e-4)

    # RoPE only sees position differences, so the per-row offset of left padding is harmless; what the
    # check does catch is the padding itself: attending to the pad positions changes the padded rows
    with torch.no_grad():
        naive = policy(input_ids=r.sequences).logits
    P = r.prompt_len
    naive = naive[:, P - 1 : P + T - 1].log_softmax(-1).gather(-1, resp[..., None]).squeeze(-1)
    padded = ~r.attention_mask[:, 0]
    assert (naive - full)[padded[:, None] & m].abs().max() > 1e-2
    unpadded = ~padded[:, None] & m
    assert torch.allclose(naive[unpadded], full[unpadded], atol=1e-4)


def test_dlc_samples_from_the_calibrated_distribution(tokenizer):
    policy = sharpen(build_model(tokenizer, seed=0), seed=10)
    memory = sharpen(build_model(tokenizer, hidden_size=32, num_heads=2, num_kv_heads=1, seed=1), seed=11)
    mu, n = 1.0, 4000
    r = sample(
        policy,
        tokenizer,
        PROMPTS[:1],
        group_size=n,
        max_new_tokens=1,
        memory=memory,
        mu=mu,
        generator=torch.Generator().manual_seed(1),
    )
    ids, mask = encode_prompts(tokenizer, PROMPTS[:1])
    p_dlc = sampling_probs(policy, memory, mu, ids, mask)[0]
    p_pol = sampling_probs(policy, None, 0.0, ids, mask)[0]
    first = r.sequences[:, r.prompt_len]
    freq = torch.bincount(first, minlength=len(p_dlc)).float() / n
    assert tv(freq, p_dlc) < 0.05
    assert tv(p_dlc, p_pol) > 0.2 and tv(freq, p_pol) > 0.2  # the calibration really moved the distribution
    assert torch.allclose(r.logprobs[:, 0], p_dlc.log()[first], atol=1e-5)
    # and the policy-only distribution is what mu = 0 samples, memory or not
    with torch.no_grad():
        f_theta = policy(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    assert torch.allclose(p_pol, f_theta[0, -1].softmax(-1), atol=1e-6)


def test_dlc_multi_step_logprobs_and_mu_zero_ignores_memory(tokenizer):
    policy = sharpen(build_model(tokenizer, seed=0), seed=10)
    memory = sharpen(build_model(tokenizer, hidden_size=32, num_heads=2, num_kv_heads=1, seed=1), seed=11)
    kw = dict(group_size=4, max_new_tokens=6)
    r = sample(policy, tokenizer, PROMPTS, memory=memory, mu=0.7, generator=torch.Generator().manual_seed(2), **kw)
    with torch.no_grad():
        lp_pol, lp_mem = full_forward_logprobs(policy, r), full_forward_logprobs(memory, r)
    assert not torch.allclose(r.logprobs, lp_pol, atol=1e-2)
    # cached DLC steps: log softmax(f_theta - mu f_phi) at every position, computed without caches
    kw_full = dict(input_ids=r.sequences, attention_mask=r.attention_mask, position_ids=r.position_ids)
    with torch.no_grad():
        f = policy(**kw_full).logits - 0.7 * memory(**kw_full).logits
    P, T = r.prompt_len, r.logprobs.shape[1]
    expected = f[:, P - 1 : P + T - 1].log_softmax(-1).gather(-1, r.responses[..., None]).squeeze(-1)
    assert torch.allclose(r.logprobs, expected * r.response_mask, atol=1e-4)
    assert lp_mem.shape == lp_pol.shape

    a = sample(policy, tokenizer, PROMPTS, memory=memory, mu=0.0, generator=torch.Generator().manual_seed(3), **kw)
    b = sample(policy, tokenizer, PROMPTS, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.logprobs, b.logprobs)
    with pytest.raises(ValueError, match="memory"):
        sample(policy, tokenizer, PROMPTS, mu=0.5, **kw)


def test_tiny_top_p_is_greedy_and_temperature_top_p_logprobs(tokenizer):
    policy = sharpen(build_model(tokenizer, seed=0))
    gen = torch.Generator().manual_seed(0)
    greedy = sample(policy, tokenizer, PROMPTS, group_size=16, max_new_tokens=8, top_p=1e-6, generator=gen)
    argmax = sample(policy, tokenizer, PROMPTS, group_size=16, max_new_tokens=8, temperature=0.0)
    assert torch.equal(greedy.sequences, argmax.sequences)
    for rows in greedy.sequences.view(len(PROMPTS), 16, -1):
        assert (rows == rows[0]).all()  # every sample of a prompt is the same greedy string
    assert (greedy.logprobs == 0).all()  # the sampling distribution is a point mass

    ids, mask = encode_prompts(tokenizer, PROMPTS[:1])
    probs = sampling_probs(policy, None, 0.0, ids, mask)[0]
    assert greedy.sequences[0, greedy.prompt_len] == probs.argmax()

    # temperature, then nucleus: sampled first tokens stay in the nucleus, with renormalised log-probs
    temp, top_p = 0.7, 0.6
    r = sample(
        policy,
        tokenizer,
        PROMPTS[:1],
        group_size=2000,
        max_new_tokens=1,
        temperature=temp,
        top_p=top_p,
        generator=gen,
    )
    q = (probs.log() / temp).softmax(-1)
    sorted_q, order = q.sort(descending=True)
    keep = order[(sorted_q.cumsum(0) - sorted_q) < top_p]
    first = r.sequences[:, r.prompt_len]
    assert torch.isin(first, keep).all() and len(keep) > 1 and len(first.unique()) == len(keep)
    assert torch.allclose(r.logprobs[:, 0], (q[first] / q[keep].sum()).log(), atol=1e-5)


def test_sampling_is_deterministic_for_a_generator_seed(tokenizer):
    policy = boost_eos(sharpen(build_model(tokenizer, seed=0)), tokenizer, bias=1.0)
    memory = sharpen(build_model(tokenizer, seed=5), seed=6)
    runs = [
        sample(
            policy,
            tokenizer,
            PROMPTS,
            group_size=6,
            max_new_tokens=8,
            temperature=0.9,
            top_p=0.95,
            memory=memory,
            mu=0.3,
            generator=torch.Generator().manual_seed(seed),
        )
        for seed in (7, 7, 8)
    ]
    a, b, c = runs
    for field in ("sequences", "response_mask", "logprobs", "entropy", "attention_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert a.texts == b.texts and a.prompt_len == b.prompt_len
    assert not torch.equal(a.sequences, c.sequences)


def test_top_k_keeps_only_the_k_most_likely_tokens():
    from calibrl.sampling import _filter_top_k

    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0, 2.0]])
    kept = _filter_top_k(logits, 2)
    assert torch.isfinite(kept).tolist() == [[False, True, True, False, True]]  # ties at the k-th value stay
    assert torch.equal(_filter_top_k(logits, 10), logits)
