"""Bad input, the way a new user types it: every case must be refused with a clear message, before any
kernel starts, and without a traceback. The table is the tally the suite issue asks for:

    python -m pytest tests/report/test_bad_inputs.py -q -s     # the last test prints the tally

Each case is (id, argv, expected exit status, a piece of the message). `{tmp}` is a fresh folder,
`{file}` a plain file in it, `{dir}` a folder in it, `{run}` a finished run of the tiny preset, and
`{bad:NAME}` the preset file NAME of BAD_PRESETS, `{never}` where a refused run must write nothing. Cases marked `after` may start compute (their
answer is a finding of the run, an exit status other than 0); every other case fails if anything
starts to run: the runner's notebook executor and the invariance experiment are replaced by a
tripwire.
"""

from __future__ import annotations

import re

import pytest
import torch

from gdn_lab import cli
from gdn_lab.report import runner

NO_GPU = not torch.cuda.is_available()

BAD_PRESETS = {
    "malformed": "parameters: [1, 2\n",
    "tabs": "parameters:\n\tseed: 1\n",
    "empty": "",
    "comments": "# nothing here\n",
    "list": "- a\n- b\n",
    "scalar": "just text\n",
    "typo_top": "paramaters: {seed: 1}\n",
    "params_scalar": "parameters: 3\n",
    "notebooks_list": "notebooks: [a, b]\n",
    "notebook_list": "notebooks:\n  01_batch_invariance: [1]\n",
    "unknown_notebook": "notebooks:\n  99_nothing: {seed: 1}\n",
    "description_list": "description: [a, b]\nparameters: {seed: 1}\n",
    "sets_nothing": "parameters: {}\nnotebooks: {}\n",
    "undeclared": "parameters: {colour: red}\n",
    "out_dir": "parameters: {out_dir: /tmp/x}\n",
    "preset_key": "parameters: {preset: h200}\n",
    "nb_out_dir": "notebooks:\n  01_batch_invariance: {out_dir: /tmp/x}\n",
    "fixed": "notebooks:\n  02_partition_edges: {op: gdn_decode}\n",
    "nb_unknown": "notebooks:\n  01_batch_invariance: {colour: red}\n",
    "seed_abc": "parameters: {seed: abc}\n",
    "device_gpu": "parameters: {device: gpu}\n",
    "device_cuda": "parameters: {device: cuda}\n",
    "dtype_int8": "parameters: {device: cpu, dtype: int8}\n",
    "trials_0": "parameters: {device: cpu}\nnotebooks:\n  01_batch_invariance: {trials: 0}\n",
    "duplicate": "parameters:\n  seed: 1\n  seed: 2\n",
    "duplicate_nested": "notebooks:\n  01_batch_invariance:\n    ops: [gdn_decode]\n    ops: [decode_attention]\n",
    "key_number": "parameters: {1: 2}\n",
    "binary": "\udcff",
}

CPU = ["--preset", "cpu-smoke"]
RUN = ["run", *CPU, "--out", "{never}"]


def run_p(*pairs, only=None):
    argv = list(RUN)
    if only:
        argv += ["--only", *only]
    for pair in pairs:
        argv += ["-p", pair]
    return argv


def without_gpu(*case):
    """A case that is bad only where torch sees no GPU."""
    return pytest.param(case, marks=pytest.mark.skipif(not NO_GPU, reason="a GPU is visible"), id=case[0])


INV = ["invariance", "--device", "cpu"]
DECODE = [*INV, "--op", "decode_attention", "--backend", "torch"]

# fmt: off
CASES = [
    # --- presets: names, paths, files ---------------------------------------------------------
    ('preset unknown name', ['run', '--preset', 'nope', '--out', '{never}'], 2, "preset: 'nope' is not known; accepted: cpu-smoke"),
    ('preset empty name', ['run', '--preset', '', '--out', '{never}'], 2, 'preset: expected a name or a path'),
    ('preset missing path', ['run', '--preset', '{tmp}/nope.yaml', '--out', '{never}'], 2, 'does not exist'),
    ('preset is a folder', ['run', '--preset', '{dir}.yaml', '--out', '{never}'], 2, 'is not a file'),
    ('preset missing', ['run', '--out', '{never}'], 2, '--preset is required'),
    ('preset file malformed', ['run', '--preset', '{bad:malformed}', '--out', '{never}'], 2, 'not valid YAML at line'),
    ('preset file tabs', ['run', '--preset', '{bad:tabs}', '--out', '{never}'], 2, 'not valid YAML at line 2'),
    ('preset file empty', ['run', '--preset', '{bad:empty}', '--out', '{never}'], 2, 'the file is empty'),
    ('preset file comments', ['run', '--preset', '{bad:comments}', '--out', '{never}'], 2, 'the file is empty'),
    ('preset file list', ['run', '--preset', '{bad:list}', '--out', '{never}'], 2, 'expected a mapping with keys description, parameters, notebooks, gate, longest_first, got a list'),
    ('preset file scalar', ['run', '--preset', '{bad:scalar}', '--out', '{never}'], 2, 'expected a mapping'),
    ('preset file typo_top', ['run', '--preset', '{bad:typo_top}', '--out', '{never}'], 2, "unknown top-level keys ['paramaters']"),
    ('preset file params_scalar', ['run', '--preset', '{bad:params_scalar}', '--out', '{never}'], 2, 'parameters must be a mapping of name: value, got 3'),
    ('preset file notebooks_list', ['run', '--preset', '{bad:notebooks_list}', '--out', '{never}'], 2, 'notebooks must be a mapping'),
    ('preset file notebook_list', ['run', '--preset', '{bad:notebook_list}', '--out', '{never}'], 2, 'notebooks.01_batch_invariance must be a mapping'),
    ('preset file unknown_notebook', ['run', '--preset', '{bad:unknown_notebook}', '--out', '{never}'], 2, 'notebooks 99_nothing are not in the suite; accepted: 00_environment_and_routing'),
    ('preset file description_list', ['run', '--preset', '{bad:description_list}', '--out', '{never}'], 2, 'description must be one line of text'),
    ('preset file sets_nothing', ['run', '--preset', '{bad:sets_nothing}', '--out', '{never}'], 2, 'sets nothing'),
    ('preset file undeclared', ['run', '--preset', '{bad:undeclared}', '--out', '{never}'], 2, 'parameters: colour not declared by any notebook of the suite; accepted: '),
    ('preset file out_dir', ['run', '--preset', '{bad:out_dir}', '--out', '{never}'], 2, 'out_dir is set by the runner, not a notebook parameter; use --out'),
    ('preset file preset_key', ['run', '--preset', '{bad:preset_key}', '--out', '{never}'], 2, 'preset is set by the runner, not a notebook parameter; use --preset'),
    ('preset file nb_out_dir', ['run', '--preset', '{bad:nb_out_dir}', '--out', '{never}'], 2, 'notebooks.01_batch_invariance: out_dir is set by the runner'),
    ('preset file fixed', ['run', '--preset', '{bad:fixed}', '--out', '{never}'], 2, "notebooks.02_partition_edges.op: the notebook fixes op = 'decode_attention'"),
    ('preset file nb_unknown', ['run', '--preset', '{bad:nb_unknown}', '--out', '{never}'], 2, 'notebooks.01_batch_invariance: colour not parameters of 01_batch_invariance; accepted: '),
    ('preset file seed_abc', ['run', '--preset', '{bad:seed_abc}', '--out', '{never}'], 2, "00_environment_and_routing: seed: expected an integer, got 'abc' (seed='abc' from preset"),
    ('preset file device_gpu', ['run', '--preset', '{bad:device_gpu}', '--out', '{never}'], 2, "device: 'gpu' is not accepted; expected one of 'auto', 'cpu', 'cuda'"),
    ('preset file dtype_int8', ['run', '--preset', '{bad:dtype_int8}', '--out', '{never}'], 2, "dtype: 'int8' is not accepted"),
    ('preset file trials_0', ['run', '--preset', '{bad:trials_0}', '--out', '{never}'], 2, '01_batch_invariance: trials: expected a positive number, got 0'),
    ('preset file duplicate', ['run', '--preset', '{bad:duplicate}', '--out', '{never}'], 2, "the key 'seed' is given twice in one mapping"),
    ('preset file duplicate_nested', ['run', '--preset', '{bad:duplicate_nested}', '--out', '{never}'], 2, "the key 'ops' is given twice"),
    ('preset file key_number', ['run', '--preset', '{bad:key_number}', '--out', '{never}'], 2, 'parameters has keys that are not parameter names: [1]'),
    ('preset file binary', ['run', '--preset', '{bad:binary}', '--out', '{never}'], 2, 'cannot be read (UnicodeDecodeError'),
    without_gpu('preset device cuda without a GPU', ['run', '--preset', '{bad:device_cuda}', '--out', '{never}'], 2, "device: 'cuda' requested but torch sees no CUDA/ROCm device"),
    without_gpu('GPU preset on the CPU', ['run', '--preset', 'h200', '--out', '{never}'], 2, "device: 'cuda'"),
    # --- -p: syntax -----------------------------------------------------------------------------
    ('-p without =', run_p('seed'), 2, "-p: expected KEY=VALUE, got 'seed'"),
    ('-p without key', run_p('=3'), 2, '-p: expected KEY=VALUE'),
    ('-p key with a space', run_p('se ed=1'), 2, "-p: 'se ed' is not a parameter name"),
    ('-p key twice', run_p('seed=1', 'seed=2'), 2, '-p: seed is given twice'),
    ('-p malformed YAML', run_p('targets=[1, 2'), 2, "-p targets: '[1, 2' is not a valid YAML value"),
    ('-p duplicate YAML key', run_p('attention={head_dim: 2, head_dim: 4}'), 2, "is not a valid YAML value (the key 'head_dim' is given twice"),
    ('-p undeclared', run_p('no_such=1'), 2, '-p: no_such not declared by the selected notebooks'),
    ('-p declared elsewhere', run_p('ops=[gdn_decode]', only=['02']), 2, '-p: ops not declared by the selected notebooks (02_partition_edges)'),
    ('-p out_dir', run_p('out_dir=/tmp/x'), 2, '-p: out_dir is set by the runner, not a notebook parameter; use --out'),
    ('-p preset', run_p('preset=h200'), 2, '-p: preset is set by the runner, not a notebook parameter; use --preset'),
    # --- -p: values, every notebook ---------------------------------------------------------------
    ('-p seed abc', run_p('seed=abc'), 2, "00_environment_and_routing: seed: expected an integer, got 'abc' (seed='abc' from -p"),
    ('-p seed float', run_p('seed=1.5'), 2, 'seed: expected an integer, got 1.5'),
    ('-p seed bool', run_p('seed=true'), 2, 'seed: expected an integer, got True'),
    ('-p seed null', run_p('seed=null'), 2, 'seed: expected an integer, got None'),
    ('-p device gpu', run_p('device=gpu'), 2, "device: 'gpu' is not accepted"),
    ('-p device number', run_p('device=0'), 2, 'device: expected a string, got 0'),
    ('-p dtype int8', run_p('dtype=int8'), 2, "dtype: 'int8' is not accepted"),
    ('-p dtype float64', run_p('dtype=float64'), 2, "dtype: 'float64' is not accepted"),
    ('01 trials 0', run_p('trials=0', only=['01']), 2, '01_batch_invariance: trials: expected a positive number, got 0'),
    ('01 trials negative', run_p('trials=-1', only=['01']), 2, 'trials: expected a positive number, got -1'),
    ('01 trials nan', run_p('trials=.nan', only=['01']), 2, 'trials: expected an integer, got nan'),
    ('01 trials text', run_p('trials=two', only=['01']), 2, "trials: expected an integer, got 'two'"),
    ('01 targets zero', run_p('targets=[0, 257]', only=['01']), 2, 'targets: expected positive integers, got (0, 257)'),
    ('01 targets negative', run_p('targets=[-5]', only=['01']), 2, 'targets: expected positive integers, got (-5,)'),
    ('01 targets empty', run_p('targets=[]', only=['01']), 2, 'targets: expected positive integers, got ()'),
    ('01 targets scalar', run_p('targets=5', only=['01']), 2, 'targets: expected a list of int, got 5'),
    ('01 targets text', run_p('targets=[a]', only=['01']), 2, "targets[0]: expected an integer, got 'a'"),
    ('01 batch sizes zero', run_p('batch_sizes=[0]', only=['01']), 2, 'batch_sizes: expected positive integers'),
    ('01 max_context zero', run_p('max_context=0', only=['01']), 2, 'max_context: expected a positive number, got 0'),
    ('01 ops unknown', run_p('ops=[nope]', only=['01']), 2, "01_batch_invariance: ops: 'nope' is not accepted; expected one of"),
    ('01 ops empty', run_p('ops=[]', only=['01']), 2, 'ops: expected at least one op'),
    ('01 ops scalar', run_p('ops=decode_attention', only=['01']), 2, "ops: expected a list of str, got 'decode_attention'"),
    ('01 backends unknown', run_p('backends=[nope]', only=['01']), 2, "backends: 'nope' is not a backend of any op; accepted: "),
    ('01 backends of no chosen op', run_p('backends=[fla]', 'ops=[decode_attention]', only=['01']), 2, 'backends: none of fla is a backend of decode_attention'),
    ('01 kv_dtype unknown', run_p('kv_dtype=fp4', only=['01']), 2, "kv_dtype: 'fp4' is not accepted; expected auto, fp8 or one of"),
    ('01 quantize_fp8 text', run_p('quantize_fp8=maybe', only=['01']), 2, "quantize_fp8: expected true or false, got 'maybe'"),
    ('01 quantize_fp8 int', run_p('quantize_fp8=1', only=['01']), 2, 'quantize_fp8: expected true or false, got 1'),
    ('01 attention not divisible', run_p('attention={num_q_heads: 3}', only=['01']), 2, 'num_q_heads (=3) must be divisible by num_kv_heads'),
    ('01 attention unknown field', run_p('attention={heads: 2}', only=['01']), 2, 'attention: heads not accepted; accepted fields: num_q_heads'),
    ('01 attention negative', run_p('attention={num_q_heads: -1}', only=['01']), 2, 'attention.num_q_heads: expected a positive int, got -1'),
    ('01 attention scalar', run_p('attention=5', only=['01']), 2, 'attention: expected a mapping, got 5'),
    ('01 gdn not divisible', run_p('gdn={num_k_heads: 3, num_v_heads: 4}', only=['01']), 2, 'num_v_heads (=4) must be divisible by num_k_heads (=3)'),
    ('01 gdn conv width', run_p('gdn={conv_width: 1}', only=['01']), 2, '01_batch_invariance: gdn.conv_width: must be at least 2, got 1'),
    ('01 -p shadowed by every op', run_p('gdn={num_k_heads: 2, num_v_heads: 4}', only=['01']), 2, '-p gdn: 01_batch_invariance would not use this value: op_overrides gives gdn_decode, gdn_prefill, gdn_layer_prefill their own gdn'),
    ('01 -p kv_dtype without a KV op', run_p('kv_dtype=fp8', 'ops=[gdn_decode]', only=['01']), 2, '-p kv_dtype: 01_batch_invariance would not use this value: none of gdn_decode has a KV cache'),
    ('01 override unknown op', run_p('op_overrides={gdn_decod: {}}', only=['01']), 2, 'op_overrides: gdn_decod not an op; accepted: '),
    ('01 override unknown field', run_p('op_overrides={gdn_decode: {colour: 1}}', only=['01']), 2, 'op_overrides.gdn_decode: colour not accepted'),
    ('01 override bad value', run_p('op_overrides={gdn_decode: {trials: 0}}', only=['01']), 2, 'op_overrides.gdn_decode.trials: expected a positive number, got 0'),
    ('01 override scalar', run_p('op_overrides=[1]', only=['01']), 2, 'op_overrides: expected a mapping, got [1]'),
    ('01 override min > max', run_p('op_overrides={decode_attention: {min_context: 50, max_context: 10}}', only=['01']), 2, 'max_context: must be >= min_context (=50), got 10'),
    ('01 override kv on GDN', run_p('op_overrides={gdn_decode: {kv_dtype: fp8}}', only=['01']), 2, 'kv_dtype: gdn_decode has no KV cache'),
    ('01 override foreign backend', run_p('op_overrides={decode_attention: {backends: [fla]}}', only=['01']), 2, 'backends: none of fla is a backend of decode_attention'),
    ('02 op unknown', run_p('op=nope', only=['02']), 2, "02_partition_edges: op: 'nope' is not accepted"),
    ('02 op without oracle', run_p('op=gdn_decode', only=['02']), 2, "op: 'gdn_decode' has no float64 oracle (OpSpec.exact); accepted: "),
    ('02 backends unknown', run_p('backends=[nope]', only=['02']), 2, "backends: 'nope' is not a backend of decode_attention; accepted: "),
    ('02 contexts zero', run_p('contexts=[0]', only=['02']), 2, 'contexts: expected positive integers'),
    ('02 batch size zero', run_p('batch_size=0', only=['02']), 2, 'batch_size: expected a positive number, got 0'),
    ('02 max_context negative', run_p('max_context=-3', only=['02']), 2, 'max_context: expected a positive number, got -3'),
    ('02 include_controls text', run_p('include_controls=maybe', only=['02']), 2, 'include_controls: expected true or false'),
    ('03 arches unknown', run_p('arches=[gfx90a]', only=['03']), 2, "arches: 'gfx90a' is not accepted; expected gfx942, gfx950, sm_XX or auto"),
    ('03 arches empty', run_p('arches=[]', only=['03']), 2, 'arches: expected at least one arch'),
    ('03 arches scalar', run_p('arches=gfx942', only=['03']), 2, "arches: expected a list of str, got 'gfx942'"),
    ('03 k_scale zero', run_p('k_scale=0', only=['03']), 2, 'k_scale: expected a positive number, got 0.0'),
    ('03 k_scale negative', run_p('k_scale=-1', only=['03']), 2, 'k_scale: expected a positive number, got -1.0'),
    ('03 k_scale nan', run_p('k_scale=.nan', only=['03']), 2, 'k_scale: expected a positive number, got nan'),
    ('03 k_scale inf', run_p('k_scale=.inf', only=['03']), 2, 'k_scale: expected a positive number, got inf'),
    ('03 v_scale text', run_p('v_scale=abc', only=['03']), 2, "v_scale: expected a number, got 'abc'"),
    ('03 batch size negative', run_p('batch_size=-3', only=['03']), 2, 'batch_size: expected a positive number, got -3'),
    ('03 op without KV cache', run_p('op=gdn_decode', only=['03']), 2, "op: 'gdn_decode' needs a KV cache and a float64 oracle"),
    ('04 invariance batch sizes', run_p('invariance_batch_sizes=[0]', only=['04']), 2, 'invariance_batch_sizes: expected positive integers'),
    ('04 arch unknown', run_p('quantize_fp8=true', 'arch=gfx90a', only=['04']), 2, "04_fused_prefill_parity: arch: 'gfx90a' has no fp8 KV format known to gdn_lab; accepted: gfx942, gfx950"),
    ('04 backends unknown', run_p('backends=[nope]', only=['04']), 2, "backends: 'nope' is not a backend of gdn_layer_prefill"),
    ('07 case bad value', run_p('ops={decode_attention: {targets: [0]}}', only=['07']), 2, 'ops.decode_attention.targets: expected positive integers'),
    ('07 op without rule', run_p('ops={rms_norm: {}}', only=['07']), 2, "ops: 'rms_norm' has no backend that carries a dispatch rule; accepted: "),
    ('07 every op null', run_p('ops={decode_attention: null, prefill_attention: null}', only=['07']), 2, 'ops: every op is null, so nothing would run'),
    ('07 case unknown field', run_p('ops={decode_attention: {colour: 1}}', only=['07']), 2, 'ops.decode_attention: colour not accepted'),
    ('07 case foreign backend', run_p('ops={decode_attention: {backends: [torch]}}', only=['07']), 2, "ops.decode_attention.backends: 'torch' is not accepted"),
    ('07 arch unknown', run_p('arch=gfx1100', only=['07']), 2, 'gfx1100'),
    ('07 num_cus zero', run_p('num_cus=0', only=['07']), 2, 'num_cus: expected a positive number, got 0'),
    ('07 num_cus negative', run_p('num_cus=-4', only=['07']), 2, 'num_cus: expected a positive number, got -4'),
    ('07 -p shadowed by every case set', run_p('kv_dtype=fp8', 'ops={decode_attention: {kv_dtype: null}}', only=['07']), 2, '-p kv_dtype: 07_aiter_triton_on_any_gpu would not use this value: every case set of ops gives its own kv_dtype'),
    ('07 case set not a mapping', run_p('ops={decode_attention: [1]}', only=['07']), 2, 'ops.decode_attention: expected a mapping, a list of mappings or null, got [1]'),
    ('07 empty case list', run_p('ops={decode_attention: []}', only=['07']), 2, 'ops.decode_attention: expected its cases or a non-empty list of case sets'),
    ('07 ops scalar', run_p('ops=decode_attention', only=['07']), 2, "ops: expected a mapping, got 'decode_attention'"),
    # --- --only, --out, --archive, --resume ---------------------------------------------------------
    ('--only unknown', [*RUN, '--only', '99_nothing'], 2, "--only: '99_nothing' is not a notebook of the suite; accepted: 00_environment_and_routing"),
    ('--only ambiguous', [*RUN, '--only', '0'], 2, "--only: '0' matches several notebooks"),
    ('--only empty', [*RUN, '--only', ''], 2, "--only: '' is not a notebook of the suite"),
    ('--out is a file', ['run', *CPU, '--out', '{file}'], 2, '--out: {file} exists and is not a directory'),
    ('--out under a file', ['run', *CPU, '--out', '{file}/sub'], 2, '--out: {file}/sub cannot be created: {file} is not a directory'),
    ('--out of another preset', ['run', '--preset', 'h200', '-p', 'device=cpu', '--out', '{run}'], 2, "holds a run of preset 'cpu-smoke'"),
    ('--archive is a folder', [*RUN, '--archive', '{dir}.tar.gz'], 2, '--archive: {dir}.tar.gz is a directory'),
    ('--archive not tar.gz', [*RUN, '--archive', '{tmp}/run.zip'], 2, '--archive: {tmp}/run.zip must end in .tar.gz'),
    ('--archive inside the run', [*RUN, '--archive', '{never}/run.tar.gz'], 2, 'is inside the run directory'),
    ('--archive under a file', [*RUN, '--archive', '{file}/run.tar.gz'], 2, '--archive: {file} exists and is not a directory'),
    ('--resume missing', ['run', '--resume', '{tmp}/missing'], 2, '--resume: {tmp}/missing holds no run to resume'),
    ('--jobs 0', [*RUN, '--jobs', '0'], 2, '--jobs: expected an int >= 1, got 0'),
    ('--jobs not a number', [*RUN, '--jobs', 'two'], 2, "argument --jobs: invalid int value: 'two'"),
    ('--resume and another --out', ['run', *CPU, '--resume', '{run}', '--out', '{tmp}/other'], 2, '--resume {run} and --out {tmp}/other differ'),
    ('--resume a folder with a foreign summary', ['run', *CPU, '--resume', '{foreign}'], 2, 'summary.json is not a gdn-lab summary'),
    # --- gdn-lab invariance -------------------------------------------------------------------
    ('inv op unknown', [*INV, '--op', 'nope', '--backend', 'torch'], 2, "argument --op: invalid choice: 'nope'"),
    ('inv op missing', [*INV, '--backend', 'torch'], 2, 'the following arguments are required: --op'),
    ('inv backend missing', [*INV, '--op', 'gdn_decode'], 2, 'the following arguments are required: --backend'),
    ('inv backend unknown', [*INV, '--op', 'gdn_decode', '--backend', 'nope'], 2, "--backend: 'nope' is not a backend of gdn_decode; accepted: "),
    ('inv backend of another op', [*INV, '--op', 'decode_attention', '--backend', 'fla'], 2, "--backend: 'fla' is not a backend of decode_attention"),
    ('inv targets zero', [*DECODE, '--targets', '0'], 2, "argument --targets: expected positive integers, got '0'"),
    ('inv targets negative', [*DECODE, '--targets=-1'], 2, "argument --targets: expected positive integers, got '-1'"),
    ('inv targets text', [*DECODE, '--targets', 'a,b'], 2, "argument --targets: expected comma-separated integers, got 'a,b'"),
    ('inv targets empty', [*DECODE, '--targets', ''], 2, "argument --targets: expected positive integers, got ''"),
    ('inv batch sizes zero', [*DECODE, '--batch-sizes', '0,2'], 2, "argument --batch-sizes: expected positive integers, got '0,2'"),
    ('inv max-context zero', [*DECODE, '--max-context', '0'], 2, "argument --max-context: expected a positive integer, got '0'"),
    ('inv max-context text', [*DECODE, '--max-context', 'big'], 2, "argument --max-context: expected a positive integer, got 'big'"),
    ('inv seed text', [*DECODE, '--seed', 'abc'], 2, "argument --seed: expected an integer, got 'abc'"),
    ('inv seed float', [*DECODE, '--seed', '1.5'], 2, "argument --seed: expected an integer, got '1.5'"),
    ('inv kv-dtype without a KV cache', [*INV, '--op', 'gdn_decode', '--backend', 'torch', '--kv-dtype', 'fp8'], 2, '--kv-dtype: gdn_decode has no KV cache'),
    ('inv kv-dtype unknown', [*DECODE, '--kv-dtype', 'fp4'], 2, "argument --kv-dtype: invalid choice: 'fp4'"),
    ('inv dtype unknown', [*DECODE, '--dtype', 'int8'], 2, "argument --dtype: invalid choice: 'int8'"),
    ('inv device unknown', [*DECODE[:1], '--device', 'gpu', '--op', 'decode_attention', '--backend', 'torch'], 2, "argument --device: invalid choice: 'gpu'"),
    without_gpu('inv device cuda without a GPU', ['invariance', '--device', 'cuda', '--op', 'gdn_decode', '--backend', 'torch'], 2, "--device: 'cuda' requested but torch sees no CUDA/ROCm device"),
    ('inv shape unknown field', [*DECODE, '--shape', 'heads=2'], 2, '--shape: heads not accepted; accepted fields: num_q_heads'),
    ('inv shape zero', [*DECODE, '--shape', 'num_q_heads=0'], 2, '--shape: num_q_heads: expected a positive int, got 0'),
    ('inv shape not divisible', [*DECODE, '--shape', 'num_kv_heads=3'], 2, 'num_q_heads (=8) must be divisible by num_kv_heads (=3)'),
    ('inv shape syntax', [*DECODE, '--shape', 'x'], 2, "argument --shape: expected FIELD=INT[,FIELD=INT...], got 'x'"),
    ('inv shape text value', [*DECODE, '--shape', 'num_q_heads=a'], 2, 'argument --shape: expected FIELD=INT'),
    ('inv insensitive (a finding)', [*DECODE, '--targets', '1', '--batch-sizes', '2', '--max-context', '1'], 3, 'insensitive: torch kept its bits', 'after'),
    ('inv not covered (a finding)', [*INV, '--op', 'gdn_prefill', '--backend', 'triton', '--targets', '3', '--batch-sizes', '2', '--shape', 'head_dim=24'], 4, 'incomplete: triton did not run', 'after'),
    # --- gdn-lab env, other commands ------------------------------------------------------------
    ('env device unknown', ['env', '--device', 'gpu'], 2, "argument --device: invalid choice: 'gpu'"),
    without_gpu('env device cuda without a GPU', ['env', '--device', 'cuda'], 2, '--device cuda: no CUDA/ROCm device'),
    ('unknown command', ['nope'], 2, "invalid choice: 'nope'"),
    ('fingerprint unknown preset', ['fingerprint', '--preset', 'nope', '--out', '{tmp}/g.json'], 2, "preset: 'nope' is not known"),
    ('check missing golden', ['check', '--golden', '{tmp}/missing.json'], 2, 'error:'),
    ('compare missing', ['compare', '{tmp}/a', '{tmp}/b'], 2, 'error:'),
]
# fmt: on


def _ids(case):
    return case[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """{tmp}, {file}, {dir}, the bad preset files, and a finished (faked) run of cpu-smoke."""
    import json

    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "plain.txt").write_text("not a folder\n")
    (tmp / "folder").mkdir()
    (tmp / "folder.yaml").mkdir()
    (tmp / "folder.tar.gz").mkdir()
    for name, text in BAD_PRESETS.items():
        path = tmp / f"bad-{name}.yaml"
        if name == "binary":
            path.write_bytes(b"\xff\xfe\x00 not utf-8")
        else:
            path.write_text(text)
    done = tmp / "done"
    done.mkdir()
    (done / "summary.json").write_text(
        json.dumps({"preset": "cpu-smoke", "notebooks": [], "started": "x", "finished": "y"})
    )
    foreign = tmp / "foreign"
    foreign.mkdir()
    (foreign / "summary.json").write_text('{"something": "else"}\n')
    return tmp


def _fill(arg: str, tmp, never) -> str:
    places = {
        "tmp": tmp,
        "file": tmp / "plain.txt",
        "dir": tmp / "folder",
        "run": tmp / "done",
        "foreign": tmp / "foreign",
        "never": never,
    }
    arg = re.sub(r"\{bad:(\w+)\}", lambda m: str(tmp / f"bad-{m.group(1)}.yaml"), arg)
    return re.sub(r"\{(tmp|file|dir|run|foreign|never)\}", lambda m: str(places[m.group(1)]), arg)


class ComputeStarted(AssertionError):
    pass


TALLY: dict[str, list[str]] = {
    "clear error before compute": [],
    "finding after compute": [],
    "traceback": [],
    "accepted": [],
}


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_bad_input_is_refused_clearly(case, workdir, tmp_path, capsys, monkeypatch):
    name, argv, code, message, *when = case
    after = when == ["after"]
    if not after:

        def tripwire(*args, **kwargs):
            raise ComputeStarted(f"{name}: compute started")

        monkeypatch.setattr(runner, "run_notebook", tripwire)
        monkeypatch.setattr("gdn_lab.experiments.batch_invariance.run", tripwire)
    never = tmp_path / "never"
    argv = [_fill(a, workdir, never) for a in argv]
    try:
        got = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors exit 2 with a usage line
        got = exc.code
    except ComputeStarted:
        TALLY["accepted"].append(name)
        raise
    except Exception:
        TALLY["traceback"].append(name)
        raise
    out = capsys.readouterr()
    text = out.err + out.out
    if got == 0:
        TALLY["accepted"].append(name)
    elif "Traceback" in text:
        TALLY["traceback"].append(name)
    else:
        TALLY["finding after compute" if after else "clear error before compute"].append(name)
    assert got == code, (name, text)
    assert "Traceback" not in text, text
    assert _fill(message, workdir, never) in text, (name, text)
    assert not never.exists(), "a refused run writes nothing"


def test_random_paged_kv_and_setup_refuse_bad_values(tmp_path):
    """The Python entry points a notebook user meets: the cache builder and a notebook's setup()."""
    from gdn_lab.cache import random_paged_kv
    from gdn_lab.report.environment import EnvironmentConfig
    from gdn_lab.report.notebook import setup

    checks = [
        (lambda: random_paged_kv([5, -1], 2, 8), "seq_lens: every length must be a positive int, but entry 1 is -1"),
        (lambda: random_paged_kv([], 2, 8), "seq_lens: expected a non-empty list"),
        (lambda: random_paged_kv([4], 0, 8), "num_kv_heads: expected a positive int, got 0"),
        (lambda: random_paged_kv([4], 2, 8, page_size=-16), "page_size: expected a positive int, got -16"),
        (
            lambda: setup(EnvironmentConfig, "00_environment_and_routing", preset="cpu-smoke", out_dir=str(tmp_path), device=..., seed="abc", dtype=...),
            "00_environment_and_routing: seed: expected an integer, got 'abc'",
        ),
        (
            lambda: setup(EnvironmentConfig, "00_environment_and_routing", preset="cpu-smoke", out_dir=str(tmp_path), device=...),
            "missing dtype, seed",
        ),
        (
            lambda: setup(EnvironmentConfig, "00_environment_and_routing", preset="nope", out_dir=str(tmp_path), device=..., seed=..., dtype=...),
            "preset: 'nope' is not known",
        ),
    ]  # fmt: skip
    for call, message in checks:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
        TALLY["clear error before compute"].append(message)


def test_tally():
    """The closing figures: every bad input above got a clear error (or a finding), none a traceback,
    none was silently accepted. Run the whole file for the full count."""
    counts = {k: len(v) for k, v in TALLY.items()}
    print(f"\nbad inputs tried: {sum(counts.values())}; " + "; ".join(f"{k}: {v}" for k, v in counts.items()))
    assert not TALLY["traceback"] and not TALLY["accepted"], TALLY
