"""Padding-free micro-batches for DLC's memory network: sequences packed into rows of at most ``max_tokens``
tokens, and a step's sequences split across data-parallel ranks by tokens.

A packed row is one ``(1, T)`` row of concatenated sequences whose ``position_ids`` restart at 0 for each; with
``attention_mask=None`` and no KV cache, transformers finds the sequence boundaries from the positions and keeps
attention inside each sequence (varlen flash-attention, or a block-causal mask for sdpa). ``target`` marks the
tokens that are predicted (a sequence's response tokens, never its first token), so ``hidden[:, :-1][target[:,
1:]]`` predicts ``ids[:, 1:][target[:, 1:]]`` without crossing a boundary. Like the policy's micro-batches
(OpenRLHF's ``max_tokens_per_gpu``), the budget is tokens, not sequences: 8k-token responses and short ones cost
what they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packed:
    ids: torch.Tensor  # (1, T) long
    positions: torch.Tensor  # (1, T) long, restarting at 0 for each sequence
    target: torch.Tensor  # (1, T) bool: this token is predicted (a response token, not a sequence's first)

    @property
    def targets(self) -> int:
        return int(self.target.sum())


def _check(sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> None:
    if len(sequences) != len(learn):
        raise ValueError(f"{len(sequences)} sequences and {len(learn)} masks: need the same number")
    for i, (s, m) in enumerate(zip(sequences, learn)):
        if len(s) != len(m):
            raise ValueError(f"sequence {i}: {len(s)} tokens but a mask of {len(m)}")


def pad_batch(sequences: list[torch.Tensor], learn: list[torch.Tensor], pad_id: int):
    """Right-pad 1-D token tensors into (B, L) ids, attention mask and learn mask (token t is a target)."""
    _check(sequences, learn)
    if not sequences:
        raise ValueError("no sequences to pad")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.bool)
    target = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, (s, m) in enumerate(zip(sequences, learn)):
        ids[i, : len(s)], attention[i, : len(s)], target[i, : len(s)] = s, True, m.bool()
    return ids, attention, target


def pack(sequences: list[torch.Tensor], learn: list[torch.Tensor], max_tokens: int) -> list[Packed]:
    """Rows of at most ``max_tokens`` tokens (first-fit decreasing; a longer sequence gets a row of its own)."""
    _check(sequences, learn)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rows: list[list[int]] = []
    sizes: list[int] = []
    for i in sorted(range(len(sequences)), key=lambda i: -len(sequences[i])):
        n = len(sequences[i])
        slot = next((r for r, size in enumerate(sizes) if size + n <= max_tokens), None)
        if slot is None:
            rows.append([i])
            sizes.append(n)
        else:
            rows[slot].append(i)
            sizes[slot] += n
    out = []
    for row in rows:
        ids = torch.cat([sequences[i].long() for i in row])
        positions = torch.cat([torch.arange(len(sequences[i])) for i in row])
        target = torch.cat([torch.cat([torch.zeros(1, dtype=torch.bool), learn[i][1:].bool()]) for i in row])
        out.append(Packed(ids[None], positions[None], target[None]))
    return out


def split(sequences: list[torch.Tensor], learn: list[torch.Tensor], ranks: int) -> list[tuple[list, list]]:
    """The step's sequences dealt to ``ranks`` data-parallel ranks, longest first to the rank with the fewest
    tokens (every rank gets its share of the work; some may get none when there are fewer sequences)."""
    _check(sequences, learn)
    parts: list[tuple[list, list]] = [([], []) for _ in range(ranks)]
    load = [0] * ranks
    for i in sorted(range(len(sequences)), key=lambda i: -len(sequences[i])):
        r = load.index(min(load))
        parts[r][0].append(sequences[i])
        parts[r][1].append(learn[i])
        load[r] += len(sequences[i])
    return parts
