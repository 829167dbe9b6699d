"""calibrl's fused_adam kernel for DeepSpeed 0.19.6 (calibrl.backends.openrlhf.fused_adam), tested with the real
DeepSpeed on CPU. The tests cover the op's math, DeepSpeed's engine as OpenRLHF configures it (ZeRO-3 and ZeRO-2,
bf16 and fp32, ZeRO-3's state offload), what DeepSpeed does without the kernel, the preflight check, and the
error when DeepSpeed lacks the patched symbol.

With no GPU, DeepSpeed picks its CPU accelerator. The FusedAdam class and the op dict are the same as on CUDA:
the CPU builders subclass the same ``OpBuilder`` (op_builder/cpu/builder.py L9-14). torch's CPU fused Adam kernels
run in place of its CUDA ones. Runs in ``.venv-vllm`` (``make test-vllm``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port

from calibrl.backends.openrlhf import fused_adam
from calibrl.gpu import patching

pytestmark = pytest.mark.vllm
deepspeed = pytest.importorskip("deepspeed") if not os.environ.get("CALIBRL_REQUIRE_VLLM") else __import__("deepspeed")

from deepspeed.ops.adam import FusedAdam  # noqa: E402
from deepspeed.ops.op_builder.builder import OpBuilder  # noqa: E402

LR, BETAS, EPS, DECAY = 1e-2, (0.9, 0.95), 1e-8, 0.1
NO_DECAY = ["bias", "1.weight"]  # the model's biases and its LayerNorm weight, as OpenRLHF's no-decay names


def openrlhf_ds_utils():
    """openrlhf/utils/deepspeed/deepspeed_utils.py, loaded from its file: importing it as a module would run the
    package's __init__, which imports the strategy, and that imports torchdata, which this venv does not have."""
    import openrlhf

    path = Path(openrlhf.__file__).parent / "utils" / "deepspeed" / "deepspeed_utils.py"
    spec = importlib.util.spec_from_file_location("openrlhf_deepspeed_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def kernel():
    """install() as the Ray worker's setup hook runs it; this module's hook and op are taken out afterwards."""
    fused_adam.install()
    yield
    OpBuilder._loaded_ops.pop(fused_adam.NAME, None)
    patching.remove_hooks()


# ------------------------------------------------------------------------------------------------ the op's math
def kernel_reference(p, g, m, v, step, mode, bias_correction, decay):
    """csrc/adam/multi_tensor_adam.cu L97-113 and L144-148 for one tensor, in float64; returns the new p, m, v."""
    c1 = 1 - BETAS[0] ** step if bias_correction == 1 else 1.0
    c2 = 1 - BETAS[1] ** step if bias_correction == 1 else 1.0
    if mode == 0:
        g = g + decay * p
    m = BETAS[0] * m + (1 - BETAS[0]) * g
    v = BETAS[1] * v + (1 - BETAS[1]) * g * g
    update = (m / c1) / ((v / c2).sqrt() + EPS)
    if mode != 0:
        update = update + decay * p
    return p - LR * update, m, v


CASES = {  # name: adam_w_mode, bias_correction, torch's fused kernels on CPU
    "adamw-fused": (True, True, True),
    "adam-l2-fused": (False, True, True),
    "adamw-foreach": (True, True, False),
    "adam-l2-foreach": (False, True, False),
    "adamw-no-bias-correction": (True, False, False),
    "adam-l2-no-bias-correction": (False, False, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_op_computes_what_deepspeeds_kernel_and_torch_adam_compute(case, monkeypatch):
    """DeepSpeed's FusedAdam drives the op (its own step, multi_tensor_applier and arguments) over 5 steps, fp32,
    on two parameter groups (weight decay 0.1 and 0). The result equals a float64 transcription of the CUDA kernel.
    With bias correction on, it also equals torch.optim.AdamW (adam_w_mode) or Adam (L2). The fused path calls
    torch's fused kernel exactly as torch.optim does, so its result is bit for bit the same as torch's fused=True."""
    adam_w_mode, bias_correction, fused = CASES[case]
    if not fused:  # the fallback for devices without torch's fused kernels, exercised on CPU
        monkeypatch.setattr(fused_adam, "_fused_devices", lambda: ())
    gen = torch.Generator().manual_seed(0)
    shapes = [(37, 5), (11,), (3, 4, 2)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(5)]
    decays = [DECAY, 0.0, DECAY]

    def groups(params):
        return [{"params": [params[0], params[2]], "weight_decay": DECAY}, {"params": [params[1]], "weight_decay": 0.0}]

    ours = [torch.nn.Parameter(t.clone()) for t in start]
    optimizer = FusedAdam(
        groups(ours), lr=LR, betas=BETAS, eps=EPS, adam_w_mode=adam_w_mode, bias_correction=bias_correction
    )
    assert optimizer.multi_tensor_adam is fused_adam.multi_tensor_adam
    torch_class = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    torch_runs = {}
    if bias_correction:
        for name, kwargs in {"reference": dict(foreach=False), "fused": dict(fused=True)}.items():
            params = [torch.nn.Parameter(t.clone()) for t in start]
            torch_runs[name] = params, torch_class(groups(params), lr=LR, betas=BETAS, eps=EPS, **kwargs)
    state = [(t.double(), torch.zeros_like(t.double()), torch.zeros_like(t.double())) for t in start]
    for step, step_grads in enumerate(grads, 1):
        for params, _ in [(ours, None), *torch_runs.values()]:
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
        optimizer.step()
        for _, torch_optimizer in torch_runs.values():
            torch_optimizer.step()
        assert all(torch.equal(p.grad, g) for p, g in zip(ours, step_grads)), "the op wrote a gradient"
        state = [
            kernel_reference(p, g.double(), m, v, step, int(adam_w_mode), int(bias_correction), decay)
            for (p, m, v), g, decay in zip(state, step_grads, decays)
        ]
    for p, (expected, _, v) in zip(ours, state):
        torch.testing.assert_close(p.detach(), expected.float(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(optimizer.state[p]["exp_avg_sq"], v.float(), rtol=1e-5, atol=1e-9)
    if bias_correction:
        for p, q in zip(ours, torch_runs["reference"][0]):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-6)
        if fused:
            assert all(torch.equal(p, q) for p, q in zip(ours, torch_runs["fused"][0]))


def test_bf16_parameters_take_torchs_fused_adamw_bit_for_bit():
    """16-bit parameters (FusedAdam keeps their moments in their dtype, like torch.optim) give the same bits as
    torch.optim.AdamW(fused=True)."""
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(300, generator=gen).bfloat16()
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    optimizer = FusedAdam([ours], lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY)
    reference = torch.optim.AdamW([theirs], lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY, fused=True)
    for _ in range(4):
        grad = torch.randn(300, generator=gen).bfloat16()
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs)


# ------------------------------------------------------------------------------------------ DeepSpeed's engine
@pytest.fixture(scope="module")
def distributed(tmp_path_factory):
    """One process as rank 0 of 1 (gloo). The fixture yields the folder torch would JIT-build extensions in."""
    extensions = tmp_path_factory.mktemp("torch_extensions")
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**env, "TORCH_EXTENSIONS_DIR": str(extensions)}.items():
            mp.setenv(name, value)
        # When DeepSpeed's CPU accelerator starts the torch.distributed backend, it JIT-builds a shared-memory
        # all-reduce op (comm/torch.py L31-37, L191). That is about a minute of g++ here, and a CPU-only step:
        # the CUDA accelerator has no such builder. The op counts as incompatible, so it is not built.
        mp.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
        yield extensions
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))


def batches(dtype):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(4, 8, generator=gen).to(dtype) for _ in range(3)]


def torch_reference(dtype):
    """What DeepSpeed's mixed precision does, in plain torch. fp32 master weights start as the module's
    parameters in ``dtype``, as DeepSpeed copies them. Each step runs the forward and backward passes on the
    ``dtype`` copy, clips the fp32 gradients to norm 1 and steps torch.optim.AdamW with OpenRLHF's two groups."""
    model = tiny_model()
    low = copy.deepcopy(model).to(dtype)
    names = [n for n, _ in model.named_parameters()]
    master = [torch.nn.Parameter(p.detach().to(dtype).float()) for p in model.parameters()]
    decay = [p for n, p in zip(names, master) if not any(s in n for s in NO_DECAY)]
    no_decay = [p for n, p in zip(names, master) if any(s in n for s in NO_DECAY)]
    groups = [{"params": decay, "weight_decay": DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, foreach=False)
    for x in batches(dtype):
        with torch.no_grad():
            for q, p in zip(low.parameters(), master):
                q.copy_(p)
        low.zero_grad()
        low(x).float().pow(2).mean().backward()
        for q, p in zip(low.parameters(), master):
            p.grad = q.grad.float()
        torch.nn.utils.clip_grad_norm_(master, 1.0)
        optimizer.step()
    return master


ENGINES = {  # name: ZeRO stage, OpenRLHF's --param_dtype, offload and reload the states after each step
    "zero3-bf16-sleep": (3, "bf16", True),
    "zero3-fp32": (3, "fp32", False),
    "zero2-bf16": (2, "bf16", False),
    "zero2-fp32": (2, "fp32", False),
}


@pytest.mark.parametrize("name", list(ENGINES))
def test_deepspeed_engine_as_openrlhf_configures_it_runs_fusedadam_on_torch_kernels(name, distributed):
    """deepspeed.initialize gets the config and the param groups from OpenRLHF's own deepspeed_utils, with
    optimizer=None, as DeepspeedStrategy._ds_init_train_model passes them. It then runs 3 steps. The optimizer
    ZeRO wraps is DeepSpeed's FusedAdam, and it runs calibrl's op. Nothing was loaded or compiled for it: a
    compiled op would have replaced the dict entry (builder.py L561, L624), and torch's JIT build would have left
    a folder under TORCH_EXTENSIONS_DIR. The fp32 master weights are the torch reference's. The "sleep" variant
    offloads and reloads the ZeRO-3 states after each step, as --ds.enable_sleep does (OpenRLHF's helper also
    calls torch.cuda, so the optimizer's calls are made directly). ZeRO-3's assertion that the optimizer is
    FusedAdam passes (stage3.py L3585)."""
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum
    from deepspeed.utils import safe_get_full_fp32_param

    stage, param_dtype, sleep = ENGINES[name]
    dtype = torch.bfloat16 if param_dtype == "bf16" else torch.float32
    utils = openrlhf_ds_utils()
    optim = {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": DECAY}}
    config = utils.get_train_ds_config(
        offload=False, adam_offload=False, stage=stage, param_dtype=param_dtype, max_norm=1.0, zpg=1, optim_config=optim
    )
    config.update(train_micro_batch_size_per_gpu=4, train_batch_size=4)
    model = tiny_model()
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=None,
        model_parameters=utils.get_optimizer_grouped_parameters(model, DECAY, NO_DECAY),
        config=config,
        args={"local_rank": 0},
        dist_init_required=True,
    )
    zero = {3: "DeepSpeedZeroOptimizer_Stage3", 2: "DeepSpeedZeroOptimizer"}[stage]
    assert type(engine.optimizer).__name__ == zero and type(engine.optimizer.optimizer) is FusedAdam
    assert engine.optimizer.optimizer.multi_tensor_adam is fused_adam.multi_tensor_adam
    assert OpBuilder._loaded_ops[fused_adam.NAME] is fused_adam.OP
    states = [OffloadStateTypeEnum.optim_states, OffloadStateTypeEnum.contiguous_grad_buffer]
    states += [OffloadStateTypeEnum.hp_params, OffloadStateTypeEnum.lp_grads]  # OpenRLHF's list
    for x in batches(dtype):
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
        if sleep:
            engine.optimizer.offload_states(include=states, device=OffloadDeviceEnum.cpu, pin_memory=True)
            engine.empty_partition_cache()
            engine.optimizer.reload_states()
    assert OpBuilder._loaded_ops[fused_adam.NAME] is fused_adam.OP
    assert list(distributed.iterdir()) == []
    trained = [safe_get_full_fp32_param(p) for p in engine.module.parameters()]
    for p, q, p0 in zip(trained, torch_reference(dtype), tiny_model().parameters()):
        assert (p - p0).abs().max() > 1e-3  # it trained
        torch.testing.assert_close(p, q.detach(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------ without the kernel
def test_without_the_kernel_fusedadam_goes_to_deepspeeds_jit_build(monkeypatch, tmp_path):
    """Without calibrl's entry, FusedAdam's load falls through to OpBuilder.jit_load. pip built no op
    (installed_ops). jit_load needs ninja and then a compiler: g++ for the CPU op here, nvcc on a GPU node.
    With no ninja on PATH (a node without build tools) it stops at its first requirement. The constructor
    raises, and every training job would die at actor start."""
    from deepspeed.git_version_info import installed_ops

    assert not installed_ops[fused_adam.NAME]
    monkeypatch.delitem(OpBuilder._loaded_ops, fused_adam.NAME)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    with pytest.raises(
        RuntimeError, match="Unable to JIT load the fused_adam op due to ninja not being installed"
    ) as e:
        FusedAdam([torch.nn.Parameter(torch.zeros(4))])
    assert "jit_load" in [entry.name for entry in e.traceback]
    assert fused_adam.NAME not in OpBuilder._loaded_ops


# ------------------------------------------------------------------------------- preflight, targets, failures
def test_check_passes_on_cpu():
    line = fused_adam.check("cpu")
    assert "FusedAdam on cpu runs on torch._fused_adamw_" in line and "match torch.optim.AdamW" in line, line


def test_targets_are_found_in_the_installed_deepspeed_and_a_missing_one_names_its_version():
    for target in fused_adam.TARGETS:
        target.check()  # what the launcher runs before Ray starts
    missing = fused_adam.DeepSpeedTarget(fused_adam.BUILDER, "OpBuilder._no_such_dict")
    with pytest.raises(patching.PatchTargetMissing, match=r"calibrl supplies the fused_adam kernel of DeepSpeed 0\.19"):
        missing.check()


def test_install_fails_clearly_when_deepspeed_lacks_the_op_dict(monkeypatch):
    """OpBuilder._loaded_ops is deleted from DeepSpeed's class. install() applies at once because the builder
    is imported, and it raises, naming the symbol and the versions."""
    monkeypatch.delattr(OpBuilder, "_loaded_ops")
    patching.remove_hooks()  # a fresh registration, as in a new worker
    try:
        with pytest.raises(patching.PatchTargetMissing) as e:
            fused_adam.install()
    finally:
        patching.remove_hooks()
    message = str(e.value)
    assert "deepspeed.ops.op_builder.builder:OpBuilder._loaded_ops is gone" in message, message
    assert (
        f"DeepSpeed 0.19.6 (pip install deepspeed==0.19.6); the installed DeepSpeed is {deepspeed.__version__}"
        in message
    )


FRESH_WORKER = """
import json, sys
from calibrl.backends.openrlhf import fused_adam
fused_adam.install()                      # the Ray setup hook runs first: DeepSpeed is not imported yet
before = "deepspeed" in sys.modules
from deepspeed.ops.adam import FusedAdam  # OpenRLHF's actor imports DeepSpeed later
from deepspeed.ops.op_builder.builder import OpBuilder
import torch
opt = FusedAdam([torch.nn.Parameter(torch.zeros(3))])
print(json.dumps({"before": before, "op": OpBuilder._loaded_ops["fused_adam"] is fused_adam.OP,
                  "kernel": opt.multi_tensor_adam is fused_adam.multi_tensor_adam}))
"""


def test_install_before_deepspeed_is_imported_applies_when_it_is(tmp_path):
    """The order in a Ray worker: the setup hook runs install() and DeepSpeed is imported later. This needs a
    fresh process."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", FRESH_WORKER], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"before": False, "op": True, "kernel": True}
    assert list(tmp_path.iterdir()) == []
