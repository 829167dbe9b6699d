"""Packing and dynamic batches in the CPU rehearsal: OpenRLHF 0.11.2's real ``Actor`` with packed samples, on the
rehearsal's stand-ins for flash-attn (its padding helpers in torch, ``cpu_standins.FLASH_MODULES``; sdpa for
flash_attention_2, ``cpu_standins.ACTOR_INIT``), gives the log-probs of the unpacked forward: transformers' sdpa
keeps the packed sequences apart by their restarting position ids."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openrlhf") is None or importlib.util.find_spec("deepspeed") is None,
    reason="openrlhf and deepspeed are not installed (make .venv/.installed)",
)


@pytest.fixture
def standins(monkeypatch):
    from calibrl.backends.openrlhf import cpu_standins as C

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("a real flash-attn is installed: the stand-ins step aside")
    for name in C.FLASH_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    C._flash_attn_modules()
    import openrlhf.models.actor as actor

    original = actor.Actor.__init__
    C._wrap(C.ACTOR_INIT, C._sdpa_for_flash)()
    yield actor
    actor.Actor.__init__ = original
    for name in C.FLASH_MODULES:
        sys.modules.pop(name, None)


def test_a_packed_forward_gives_the_unpacked_log_probs(standins, tmp_path):
    from calibrl.backends.openrlhf import cpu_standins as C
    from calibrl.models import build_model, build_tokenizer, save

    C.ACTOR_INIT.check()
    tok = build_tokenizer()
    arch = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    save(build_model(tok, seed=0, **arch), tok, tmp_path / "m")
    packed = standins.Actor(str(tmp_path / "m"), attn_implementation="flash_attention_2", param_dtype="bf16",
                            packing_samples=True).float()  # fmt: skip
    plain = standins.Actor(str(tmp_path / "m"), attn_implementation="sdpa", param_dtype="bf16").float()
    assert packed.model.config._attn_implementation == "sdpa"  # train_ppo_ray's flash_attention_2 replaced
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(3, 30, (3, 12), generator=gen)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4], mask[1, :1] = 0, 0  # left padding, as OpenRLHF's samples
    action = torch.ones(3, 5)
    with torch.no_grad():
        ours = packed(seq * mask, action, attention_mask=mask)
        theirs = plain(seq * mask, action, attention_mask=mask)
        # the packed row with its position ids restarting per sample, as OpenRLHF packs it: with an explicit mask
        # (no packing detected) the samples attend to each other and the numbers change
        flat = (seq * mask)[mask.bool()].unsqueeze(0)
        restart = torch.cat([torch.arange(n) for n in mask.sum(-1).tolist()])[None]
        bounded = plain.model(flat, position_ids=restart).logits
        crossed = plain.model(flat, attention_mask=torch.ones_like(flat), position_ids=restart).logits
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert not torch.allclose(bounded, crossed, atol=1e-3)
