"""DLC's sampling distribution and memory update (Section 3.2; Algorithm 1 lines 5-6, 22)."""

import pytest
import torch

from calibrl.dlc import calibrated_logits, memory_loss, sampling_distribution


def test_calibrated_distribution_is_softmax_of_the_difference():
    f_theta = torch.tensor([2.0, 1.0, 0.0, -1.0])
    f_phi = torch.tensor([3.0, 0.0, 0.0, 0.0])
    p = sampling_distribution(f_theta, f_phi, 0.5)
    expected = torch.exp(f_theta - 0.5 * f_phi)
    assert torch.allclose(p, expected / expected.sum())
    assert torch.equal(calibrated_logits(f_theta, f_phi, 0.0), f_theta)
    with pytest.raises(ValueError, match="mu must be >= 0"):
        calibrated_logits(f_theta, f_phi, -1.0)


def test_memory_training_raises_frequent_outputs_and_pushes_sampling_away():
    mem = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([mem], lr=1.0)
    sampled = torch.tensor([0, 0, 0, 1])  # output 0 generated three times as often
    for _ in range(20):
        loss = memory_loss(mem.expand(4, 4), sampled)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert mem[0] > mem[1] > mem[2]
    f_theta = torch.zeros(4)
    p = sampling_distribution(f_theta, mem.detach(), 0.5)
    assert p[0] < p[1] < p[2]  # the most generated output is the least likely to be sampled next
