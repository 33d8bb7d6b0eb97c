"""gdn_lab.ops.offline_compile and `gdn-lab kernels`: our Triton kernels compiled for GPUs this machine lacks.

Compiling needs Triton's compiled mode, which a process under TRITON_INTERPRET (this suite on the
CPU) cannot switch to once its kernels are loaded: those checks run in a fresh process.
"""

import os
import re
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from gdn_lab.cli import main
from gdn_lab.device import compiling_for, detect
from gdn_lab.ops import offline_compile as oc
from gdn_lab.ops import triton_common
from gdn_lab.ops.decode_attention import triton_kernels as dk


def _fresh_process(args: list[str], interpret: bool) -> subprocess.CompletedProcess:
    """A new Python process, with TRITON_INTERPRET=1 (as this suite's on the CPU) or without it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=900)


def test_detect_reads_every_device_as_the_gpu_compiled_for():
    info = oc.TARGETS["gfx942"].device_info
    with compiling_for(info):
        assert detect("cpu") == info and detect() == info
    assert detect("cpu").arch == "cpu"


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, "fp8"])
def test_decode_config_on_amd_keeps_the_bits_drops_the_register_cap(monkeypatch, arch, head_dim, kv_dtype):
    """AMD takes the NVIDIA config's request structure and warps (what the bits depend on), no
    `maxnreg` (Triton's HIP backend rejects it) and no more stages than the arch's LDS holds."""
    for module in (dk, triton_common):  # the config and the dots' operand kind as on a GPU
        monkeypatch.setattr(module, "interpreting", lambda: False)
    kv = oc.TARGETS[arch].device_info.fp8_dtype if kv_dtype == "fp8" else kv_dtype
    nvidia = dk.decode_config(head_dim, torch.bfloat16, kv, "sm_90")
    amd = dk.decode_config(head_dim, torch.bfloat16, kv, arch)
    assert (amd.block_n, amd.node_blocks, amd.num_warps) == (nvidia.block_n, nvidia.node_blocks, nvidia.num_warps)
    assert amd.max_registers is None
    assert amd.num_stages <= nvidia.num_stages
    if arch == "gfx942":
        assert amd.num_stages == (3 if kv_dtype == "fp8" else 2)
    else:
        assert amd.num_stages == nvidia.num_stages
    assert nvidia.max_registers == (128 if head_dim == 256 else None)  # NVIDIA's own config is untouched


@pytest.mark.parametrize(
    ("arch", "tf32", "ptx"), [("sm_90", True, True), ("gfx942", True, False), ("gfx950", False, False)]
)
def test_the_gpu_only_choices_follow_the_target(monkeypatch, arch, tf32, ptx):
    """What the launch paths decide from the GPU (TF32 dots for the delta rule's float32 operands;
    PTX's e4m3 conversion for an fp8 cache) is the target's inside `compiling_for`, for tensors on
    the CPU: the report compiles what that GPU would run."""
    from gdn_lab.ops import paged_kv_triton

    for module in (triton_common, paged_kv_triton):
        monkeypatch.setattr(module, "interpreting", lambda: False)
    cpu = torch.device("cpu")
    with compiling_for(oc.TARGETS[arch].device_info):
        prec = triton_common.dot_precision(torch.bfloat16, torch.bfloat16, float32_operands=True, device=cpu)
        assert prec.input_precision == ("tf32" if tf32 else "ieee")
        assert paged_kv_triton.ptx_e4m3(torch.float8_e4m3fn, triton_common.tl.float16, cpu) is ptx
    assert (
        triton_common.dot_precision(torch.bfloat16, torch.bfloat16, float32_operands=True, device=cpu).input_precision
        == "ieee"
    )


def test_kernels_command_rejects_bad_input_before_compiling(capsys):
    assert main(["kernels", "--target", "sm_80"]) == 2
    assert "target: 'sm_80' is not accepted; expected one of sm_90, gfx942, gfx950" in capsys.readouterr().err
    assert main(["kernels", "--op", "no_such_op"]) == 2
    assert "no_such_op" in capsys.readouterr().err


def test_decode_attention_compiles_and_fits_amd_gpus(tmp_path):
    """The command as a user runs it: every decode kernel of ours and of the control, at both head
    shapes, 16-bit and fp8 caches and both plans, compiles for gfx942 and gfx950 and fits their LDS.
    Before the AMD configs, D 256 failed on both with `maxnreg`, and on gfx942 the fp8 partition
    kernels took 96 KB of its 64 KB. (sm_90's compiles run for real in the GPU suite.)"""
    out = tmp_path / "kernels.csv"
    args = ["-m", "gdn_lab.cli", "kernels", "--target", "gfx942", "gfx950", "--op", "decode_attention", "--quiet"]
    # under TRITON_INTERPRET=1, as this suite sets it: the command compiles all the same
    done = _fresh_process([*args, "--out", str(out)], interpret=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    df = pd.read_csv(out, keep_default_na=False)
    assert set(df["target"]) == {"gfx942", "gfx950"}
    assert (df["status"] == "ok").all() and df["fits"].all()
    assert set(df["kernel"]) == {"_decode_partition_kernel", "_decode_reduce_kernel"}
    assert set(df["backend"]) == {"triton", "triton-splitk-by-batch"}
    assert set(df["shape"]) == {"32/8/128/1", "16/2/256/16"}
    assert (df["shared"] <= df["shared_limit"]).all() and (df["registers"] > 0).all()
    assert not df["options"].str.contains("maxnreg").any()
    assert (df["env_triton"] != "").all()
    for arch, limit in (("gfx942", 65536), ("gfx950", 163840)):
        line = rf"^{arch}: \d+ kernel builds, 0 cannot launch \(shared memory limit {limit} B\)$"
        assert re.search(line, done.stdout, re.M)


def test_a_kernel_that_cannot_launch_is_reported_with_the_reason(tmp_path):
    """`compiling_for` records each launch's compile for the target: too much shared memory for
    gfx942's LDS is over its limit, and a CUDA-only option is the HIP backend's refusal."""
    script = textwrap.dedent(
        """
        import torch, triton, triton.language as tl
        from gdn_lab.ops import offline_compile as oc

        @triton.jit
        def dot_kernel(x, y, n, BLOCK: tl.constexpr):
            acc = tl.zeros([BLOCK, BLOCK], tl.float32)
            o = tl.arange(0, BLOCK)
            for i in range(n):
                a = tl.load(x + i * BLOCK * BLOCK + o[:, None] * BLOCK + o[None, :])
                b = tl.load(x + (i + 1) * BLOCK * BLOCK + o[:, None] * BLOCK + o[None, :])
                acc += tl.dot(a, b)
            tl.store(y + o[:, None] * BLOCK + o[None, :], acc)

        x, y = torch.zeros(5, 128, 128, dtype=torch.bfloat16), torch.zeros(128, 128)
        target = oc.TARGETS["gfx942"]
        with oc.compiling_for(target) as compiled:
            dot_kernel[(1,)](x, y, 4, BLOCK=128, num_stages=3)  # 128 KB of LDS in Triton 3.9
            dot_kernel[(1,)](x, y, 4, BLOCK=128, num_stages=1, maxnreg=128)
            dot_kernel[(1,)](x, y, 4, BLOCK=128, num_stages=1)
        big, refused, small = compiled
        print(oc.resources(big.compiled, target)["shared"] > target.shared_memory, "maxnreg" in refused.error,
              oc.resources(small.compiled, target)["shared"] <= target.shared_memory, big.kernel)
        """
    )
    path = tmp_path / "cannot_launch.py"  # a file: Triton reads a kernel's source
    path.write_text(script)
    done = _fresh_process([str(path)], interpret=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-4:] == ["True", "True", "True", "dot_kernel"], done.stdout


def test_compiling_for_refuses_kernels_loaded_for_the_interpreter():
    """In this process (the CPU suite runs under the interpreter) the kernels cannot compile: a
    clear error, not a report of nothing."""
    import triton

    if isinstance(triton_common.round_rne, triton.runtime.jit.JITFunction):
        pytest.skip("this process runs Triton compiled (a GPU machine): nothing to refuse")
    with pytest.raises(RuntimeError, match="compiled mode"), oc.compiling_for(oc.TARGETS["gfx950"]):
        pass
