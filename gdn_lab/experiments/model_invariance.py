"""Model invariance: does a request get the same tokens and logprobs alone and inside batches, and if
not, which op changed its bits, at which step?

A whole model generates greedily (`gdn_lab.model.Model`, the lab's hybrid decoder on the lab's ops, or
any Hugging Face causal LM built from a config, `gdn_lab.model.hf`), once for the request alone and
once inside a batch, and the request's token ids and selected-token logprobs are compared bitwise.
Three modes, after SGLang's `test_deterministic`:

- `single`: one prompt of L tokens (each of `prompt_lens`), alone, then B copies of it in one batch
  (each of `batch_sizes`); every copy's response is compared with the alone response.
- `mixed`: a target of L tokens at a seeded random position among B - 1 batchmates of random
  lengths in [min_len, max_len]; at least one batchmate is shorter and one longer than the target
  where the range allows (with B = 2 the trials alternate shorter and longer).
- `prefix`: prefixes of one seeded prompt, of the lengths `prefix_lens` (shared prefixes, as
  SGLang's prefix mode); each length is the target in batches of random prefixes of the other
  lengths, at a random position.

A target of L tokens is the first L tokens of one seeded prompt in every mode.

Both runs are recorded with `gdn_lab.trace.record` at `level` ("ops": modules, torch functions and
lab ops), and `gdn_lab.trace.diff` + `first_culprit` name the first call whose output changed for the
request while all of its inputs were bitwise equal: its name, kind, op and backend, and the step it
ran in (0 = the prefill, s = decode step s). When that call is a lab op whose backend carries a
dispatch rule (`Backend.rule`: AITER's Triton kernels), the rule predicts both launches from the
call descriptions the trace kept (`record(..., keep_calls=True)`): which variant each took, and why.

Every run also runs its cases with a batch-variant control switched into the model (`control`,
"op:backend"): the lab model takes it as that op's backend; a Hugging Face model runs every
nn.Linear through `gdn_lab.ops.matmul` with it (only matmul controls apply there). Per mode, the
control is caught when one of its comparisons differs and names the control among its culprits; a
mode whose control was not caught is `insensitive`: its equalities prove nothing.

Known limits. Only the selected token's logprob is compared (as SGLang and vLLM do); a change in
the other logits shows as `logits_equal=False` (the model's root output, hashed by the trace). A
Hugging Face prefill is hashed per request with its padding left out (`Layout.padded`); its decode
steps' KV cache is padded in a mixed or prefix batch, and the cache object itself is opaque to the
trace (not a tensor, tuple, list or dict), so there a call reading it can look like a culprit with
equal recorded inputs (`trace_note` says when the two runs took different code paths, as HF's mask
building does for a padded batch). The lab model has no padding: its caches are read through the
lab ops' slots and page tables.

Example:
    >>> from gdn_lab.experiments import model_invariance as mi
    >>> res = mi.run(mi.Config(model="tiny", modes=["single"], prompt_lens=[5], batch_sizes=[3],
    ...              max_new_tokens=2, device="cpu"), progress=False)
    >>> res.table.groupby("is_control").bitwise_equal.any().to_dict()
    {False: True, True: False}
    >>> r = res.table[res.table.is_control].iloc[0]
    >>> r.control, r.culprit_backend, bool(r.control_caught)
    ('matmul:torch-splitk-by-batch', 'torch-splitk-by-batch', True)
"""

from __future__ import annotations

import contextlib
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from gdn_lab import aiter, checks, routing
from gdn_lab.device import detect
from gdn_lab.experiments.common import fmt_list
from gdn_lab.experiments.compare import compare
from gdn_lab.experiments.config import DTYPES, ExperimentConfig, check, one_of, positive, positive_ints
from gdn_lab.model import OPS, PRESETS, Generation, Model, ModelConfig
from gdn_lab.model import hf as hf_models
from gdn_lab.rules.base import RuleEnv
from gdn_lab.trace import Layout, Trace, diff, first_culprit, record
from gdn_lab.trace import summarize as summarize_calls
from gdn_lab.workloads import resolve_dtype

MODES = ("single", "mixed", "prefix")
LEVELS = ("modules", "ops")
AUTO = "auto"

COLUMNS = [
    "comparison", "model", "model_kind", "mode", "backend", "backends", "backend_ran", "is_control", "control",
    "covered", "status", "reason", "device", "arch", "platform", "dtype", "kv_dtype", "level",
    "target_len", "batch_size", "position", "trial", "seed", "batch_tokens", "batch_max_len", "max_new_tokens",
    "bitwise_equal", "tokens_equal", "logprobs_equal", "logits_equal", "n_diff", "max_abs", "max_ulp",
    "first_diff_step", "token", "token_alone", "token_batched", "logprob_alone", "logprob_batched",
    "traced", "step", "culprit_name", "culprit_kind", "culprit_op", "culprit_backend", "culprit_module",
    "n_culprits", "culprits", "control_named", "module_culprit", "first_changed_module",
    "first_changed_module_input_equal", "calls_compared", "calls_changed",
    "rule", "rule_alone", "rule_batched", "rule_expected", "rule_explanation",
    "control_caught", "insensitive", "library", "hardware_note", "trace_note",
]  # fmt: skip
CALL_COLUMNS = ["mode", "backend", "is_control", "kind", "op", "comparisons", "compared", "inputs_changed",
                "outputs_changed", "unaligned", "culprits"]  # fmt: skip
LAYER_COLUMNS = ["comparison", "mode", "backend", "is_control", "batch_size", "target_len", "position", "step",
                 "layer", "layer_label", "calls", "outputs_changed", "inputs_changed", "culprits",
                 "first_changed"]  # fmt: skip

INT_COLUMNS = ["n_diff", "max_ulp", "first_diff_step", "token", "token_alone", "token_batched", "step", "n_culprits",
               "calls_compared", "calls_changed"]  # fmt: skip
# Traces diffed per batch in single mode: copy 0, and up to this many more among the copies that differ.
MAX_DIFFS_PER_BATCH = 4
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def _known_model(name: str, value: str) -> None:
    checks.check_choice(name, value, (*PRESETS, *hf_models.BUILDERS, hf_models.CUSTOM))


def _known_modes(name: str, value: Sequence[str]) -> None:
    if not value:
        raise ValueError(f"{name}: expected at least one mode; accepted: {', '.join(MODES)}")
    for v in value:
        checks.check_choice(name, v, MODES)


@dataclass(frozen=True, kw_only=True)
class Config(ExperimentConfig):
    """One model-invariance run.

    Attributes:
        model: a lab model preset ("tiny", "tiny-moe", "qwen3-next-80b-tp4"), a Hugging Face builder
            ("hf-qwen3-tiny", "hf-qwen3-next-tiny", "hf-qwen3-next-moe-tiny", "hf-qwen3-8b"; `gdn_lab.model.hf.BUILDERS`), or
            "hf-custom": any Hugging Face causal LM the caller built, passed as `run(cfg, model=...)`.
        num_layers: the model's depth (None: the preset's or builder's).
        dtype: weights and activations (None: the model's own: fp32 for the tiny ones).
        backends: the lab model's backend per op (`gdn_lab.model.OPS`; the others run "torch");
            a Hugging Face model runs its own torch code and takes none.
        modes: which of "single", "mixed", "prefix".
        prompt_lens: target prompt lengths (single, mixed).
        prefix_lens: prefix mode's shared prefixes, each the target in turn (None: prompt_lens).
        batch_sizes: batch sizes the target runs in.
        max_new_tokens: greedy tokens per request (the first from the prefill).
        trials: batches per (target, batch size) in mixed and prefix modes.
        min_len, max_len: mixed mode's batchmates are uniform in this range.
        level: the trace level: "ops" (modules, torch functions, lab ops) or "modules".
        control: the batch-variant control switched in as "op:backend" (a variant-control backend
            of a lab op; "matmul:..." for a Hugging Face model), "auto" (the lab model on a GPU:
            decode_attention:triton-splitk-by-batch, the split-KV decode whose split count follows
            the batch; otherwise matmul:torch-splitk-by-batch, whose K slices follow the rows on any
            device), or None (no control: every mode is reported insensitive).
    """

    model: str = field(default="tiny", metadata=check(_known_model, "lab model preset or HF builder"))
    num_layers: int | None = field(default=None, metadata=check(positive, "the model's depth"))
    dtype: str | None = field(default=None, metadata=check(one_of(DTYPES), "None: the model's own"))
    backends: dict[str, str] | None = None
    modes: tuple[str, ...] = field(default=MODES, metadata=check(_known_modes, "single, mixed, prefix"))
    prompt_lens: tuple[int, ...] = field(default=(9,), metadata=check(positive_ints, "target prompt lengths"))
    prefix_lens: tuple[int, ...] | None = field(default=None, metadata=check(positive_ints, "prefix mode's prefixes"))
    batch_sizes: tuple[int, ...] = field(default=(2, 4), metadata=check(positive_ints, "batch sizes"))
    max_new_tokens: int = field(default=4, metadata=check(positive, "tokens per request"))
    trials: int = field(default=1, metadata=check(positive, "batches per (target, batch size)"))
    min_len: int = field(default=1, metadata=check(positive, "mixed: shortest batchmate"))
    max_len: int = field(default=24, metadata=check(positive, "mixed: longest batchmate"))
    level: str = field(default="ops", metadata=check(one_of(LEVELS), "trace level"))
    control: str | None = AUTO

    def validate(self) -> None:
        super().validate()
        if self.max_len < self.min_len:
            raise ValueError(f"max_len: must be >= min_len (={self.min_len}), got {self.max_len}")
        if self.is_hf:
            if self.backends:
                raise ValueError(
                    f"backends: {self.backends!r} apply to the lab model's ops; a Hugging Face model ({self.model}) "
                    "runs its own torch code: pass null"
                )
        else:
            from gdn_lab.model import resolve_backends

            resolve_backends(self.backends)
            longest = max(*self.prompt_lens, *self.shared_prefixes, self.max_len if "mixed" in self.modes else 1)
            limit = PRESETS[self.model]["max_position_embeddings"]
            if longest + self.max_new_tokens - 1 > limit:
                raise ValueError(
                    f"prompt_lens, max_len, max_new_tokens: {longest} + {self.max_new_tokens} - 1 positions exceed "
                    f"{self.model}'s max_position_embeddings (={limit})"
                )
        self.control_spec  # noqa: B018  (a bad control is an error now)

    @property
    def is_hf(self) -> bool:
        return hf_models.is_hf(self.model)

    @property
    def shared_prefixes(self) -> tuple[int, ...]:
        """prefix mode's prefix lengths."""
        return self.prompt_lens if self.prefix_lens is None else self.prefix_lens

    @property
    def model_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return resolve_dtype(self.dtype)
        if self.model == hf_models.CUSTOM:
            return torch.float32  # a stand-in: the rows take the handed-over model's own dtype
        return hf_models.BUILDERS[self.model].dtype if self.is_hf else PRESETS[self.model]["dtype"]

    @property
    def control_spec(self) -> tuple[str, str] | None:
        """(op, backend) of the control, "auto" resolved for this device and dtype; None for no control.

        Raises:
            ValueError: not "op:backend", an op the model does not call, or a backend that is not a
                variant control of the op.
        """
        if self.control is None:
            return None
        if self.control == AUTO:
            if self.torch_device.type == "cuda" and not self.is_hf:
                return ("decode_attention", "triton-splitk-by-batch")
            return ("matmul", "torch-splitk-by-batch")
        op, sep, backend = self.control.partition(":")
        ops = ("matmul",) if self.is_hf else OPS
        if not sep or op not in ops:
            raise ValueError(
                f"control: {self.control!r} is not accepted; expected 'op:backend' with op one of {', '.join(ops)}, "
                "'auto' or null"
            )
        controls = [b.name for b in routing.controls(op)]
        if backend not in controls:
            raise ValueError(
                f"control: {backend!r} is not a batch-variant control of {op}; accepted: {', '.join(controls)}"
            )
        return op, backend


# -- workloads: seeded prompts --


def _generator(seed: int, *keys: Any) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr((seed, *keys)).encode()))


def _tokens(n: int, vocab: int, g: torch.Generator) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@dataclass(frozen=True)
class Batch:
    """One batched run and the responses it compares.

    Attributes:
        mode, target_len, batch_size, trial: where it sits in the sweep.
        prompts: the batch's prompts, in row order.
        compared: the rows whose responses are compared with `alone` (single: every copy).
        alone: the target's prompt run alone.
    """

    mode: str
    target_len: int
    batch_size: int
    trial: int
    prompts: tuple[tuple[int, ...], ...]
    compared: tuple[int, ...]
    alone: tuple[int, ...]


def batches(cfg: Config, vocab: int) -> list[Batch]:
    """Every batched run of the sweep, seeded (the same config gives the same prompts).

    A target of L tokens is the first L tokens of one seeded prompt in every mode, so the three
    modes share the target's alone runs (and prefix mode's prefixes are prefixes of each other).
    """
    longest = max((*cfg.prompt_lens, *cfg.shared_prefixes))
    base = tuple(_tokens(longest, vocab, _generator(cfg.seed, "prompt")))
    out: list[Batch] = []
    for mode in cfg.modes:
        if mode == "single":
            for L in cfg.prompt_lens:
                out += [Batch(mode, L, B, 0, (base[:L],) * B, tuple(range(B)), base[:L]) for B in cfg.batch_sizes]
        elif mode == "mixed":
            for L in cfg.prompt_lens:
                for B in cfg.batch_sizes:
                    for trial in range(cfg.trials):
                        g = _generator(cfg.seed, "mixed", L, B, trial)
                        lens = _mate_lengths(L, B - 1, cfg.min_len, cfg.max_len, trial, g)
                        mates = [tuple(_tokens(n, vocab, g)) for n in lens]
                        pos = int(torch.randint(0, B, (1,), generator=g))
                        out.append(Batch(mode, L, B, trial, (*mates[:pos], base[:L], *mates[pos:]), (pos,), base[:L]))
        else:  # prefix
            lens = sorted(set(cfg.shared_prefixes))
            for L in lens:
                others = [n for n in lens if n != L] or [L]
                for B in cfg.batch_sizes:
                    for trial in range(cfg.trials):
                        g = _generator(cfg.seed, "prefix", L, B, trial)
                        picks = [others[int(i)] for i in torch.randint(0, len(others), (B - 1,), generator=g)]
                        pos = int(torch.randint(0, B, (1,), generator=g))
                        mates = [base[:n] for n in picks]
                        out.append(Batch(mode, L, B, trial, (*mates[:pos], base[:L], *mates[pos:]), (pos,), base[:L]))
    return out


def _mate_lengths(target: int, n: int, lo: int, hi: int, trial: int, g: torch.Generator) -> list[int]:
    """n lengths uniform in [lo, hi], with a shorter and a longer one than `target` where possible."""
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    shorter = list(range(lo, min(target - 1, hi) + 1))
    longer = list(range(max(target + 1, lo), hi + 1))
    wanted = [s for s in ((shorter, longer) if trial % 2 == 0 else (longer, shorter)) if s]
    for i, choices in enumerate(wanted[:n]):
        lens[i] = choices[int(torch.randint(0, len(choices), (1,), generator=g))]
    return lens


# -- the model under test --


class _Runner:
    """The lab model or an HF model, with the control switch and the labels rows carry."""

    def __init__(self, cfg: Config, model: torch.nn.Module | None = None) -> None:
        self.cfg = cfg
        dev = cfg.torch_device
        if (cfg.model == hf_models.CUSTOM) != (model is not None):
            raise ValueError(
                "model: pass a Hugging Face causal LM as run(cfg, model=...) exactly when cfg.model is 'hf-custom'"
            )
        if cfg.is_hf:
            self.hf = (
                hf_models.HFModel.wrap(model)
                if model is not None
                else hf_models.HFModel(
                    cfg.model, dtype=cfg.model_dtype, device=dev, seed=cfg.seed, num_layers=cfg.num_layers
                )
            )
            self.dtype = self.hf.dtype
            self.module: torch.nn.Module = self.hf.model
            self.vocab = self.hf.vocab_size
            self.backends: dict[str, str] = {}
            self.kind = "hf"
        else:
            overrides: dict[str, Any] = {"dtype": cfg.model_dtype, "seed": cfg.seed}
            if cfg.num_layers is not None:
                overrides["num_layers"] = cfg.num_layers
            self.lab = Model(ModelConfig.from_name(cfg.model, **overrides), backends=cfg.backends, device=dev)
            self.dtype = self.lab.config.dtype
            self.module = self.lab
            self.vocab = self.lab.config.vocab_size
            self.backends = dict(self.lab.backends)
            self.kind = "lab"
        self.keep_calls = any(
            routing.get(op, b).rule is not None for op, b in self.backends.items() if b != AUTO
        )  # fmt: skip

    @contextlib.contextmanager
    def switched(self, control: tuple[str, str] | None) -> Iterator[None]:
        if control is None:
            yield
        elif self.kind == "hf":
            with self.hf.linear_backend(control[1]):
                yield
        else:
            op, backend = control
            before = self.lab.backends[op]
            self.lab.set_backends({op: backend})
            try:
                yield
            finally:
                self.lab.set_backends({op: before})

    def generate(self, prompts: Sequence[Sequence[int]], ids: Sequence[int], trace: Trace) -> Generation:
        lists = [list(p) for p in prompts]
        n = self.cfg.max_new_tokens
        if self.kind == "hf":
            return self.hf.generate(lists, n, request_ids=ids, trace=trace)
        return self.lab.generate(lists, n, request_ids=ids, placement_seed=self.cfg.seed, trace=trace)

    def label(self, control: tuple[str, str] | None) -> str:
        if control is not None:
            return f"{control[0]}={control[1]}"
        if self.kind == "hf":
            return "torch (HF)"
        names = list(self.backends.values())
        most = max(set(names), key=names.count)
        others = [f"{op}={b}" for op, b in self.backends.items() if b != most]
        return most + (f" ({', '.join(others)})" if others else "")

    def backends_text(self, control: tuple[str, str] | None) -> str:
        chosen = dict(self.backends)
        if control is not None:
            chosen[control[0]] = control[1]
        return "; ".join(f"{op}={b}" for op, b in chosen.items())

    def libraries(self, control: tuple[str, str] | None) -> list[routing.Backend]:
        chosen = dict(self.backends)
        if control is not None:
            chosen[control[0]] = control[1]
        return [routing.get(op, b) for op, b in chosen.items() if b != AUTO]


@dataclass
class _Run:
    gen: Generation | None
    trace: Trace | None
    error: str | None = None
    covered: bool = True


def _run(runner: _Runner, prompts: Sequence[Sequence[int]], ids: Sequence[int]) -> _Run:
    try:
        with record(runner.module, Layout.per_request(list(ids)), runner.cfg.level, keep_calls=runner.keep_calls) as tr:
            gen = runner.generate(prompts, ids, tr)
        return _Run(gen, tr)
    except routing.NotCovered as exc:
        return _Run(None, None, str(exc), covered=False)
    except Exception as exc:  # a backend that raises inside the model is reported, not fatal
        return _Run(None, None, f"{type(exc).__name__}: {exc}")


# -- comparing one response --


def _first_index(mask: torch.Tensor) -> int | None:
    idx = torch.nonzero(mask).flatten()
    return int(idx[0]) if idx.numel() else None


def _outputs(alone: Generation, batched: Generation, row: int) -> dict[str, Any]:
    ta, tb = alone.tokens[0].cpu(), batched.tokens[row].cpu()
    la, lb = alone.logprobs[0].cpu(), batched.logprobs[row].cpu()
    lp = compare(la, lb)
    tok_diff = ta != tb
    lp_diff = la.view(torch.int32) != lb.view(torch.int32)
    first = _first_index(tok_diff | lp_diff)
    return {
        "bitwise_equal": bool(lp["bitwise_equal"] and not tok_diff.any()),
        "tokens_equal": not bool(tok_diff.any()),
        "logprobs_equal": bool(lp["bitwise_equal"]),
        "n_diff": int((tok_diff | lp_diff).sum()),
        "max_abs": lp["max_abs"],
        "max_ulp": lp["max_ulp"],
        "first_diff_step": first,
        "token": _first_index(tok_diff),
        "token_alone": int(ta[first]) if first is not None else None,
        "token_batched": int(tb[first]) if first is not None else None,
        "logprob_alone": float(la[first]) if first is not None else None,
        "logprob_batched": float(lb[first]) if first is not None else None,
    }


def _leaf_modules(df: pd.DataFrame) -> pd.DataFrame:
    modules = df[df.kind == "module"]
    parents = set(modules.parent)
    return modules[~modules.name.isin(parents)]


def _rule_env(device: torch.device) -> RuleEnv:
    return RuleEnv(aiter.effective_arch(device), aiter.effective_num_cus(device))


def _entry(trace: Trace, step: int, name: str, call_index: int) -> Any:
    return next(e for e in trace.entries if (e.step, e.name, e.call_index) == (step, name, call_index))


def _rule_columns(culprit: pd.Series, alone: Trace, batched: Trace, pos: int, size: int, device) -> dict[str, Any]:
    """The culprit's dispatch rule on both launches, when it is a lab op whose backend carries one."""
    if culprit["kind"] != "lab_op" or culprit["backend_b"] is None:
        return {}
    backend = routing.get(culprit["op"], culprit["backend_b"])
    rule = backend.rule
    if rule is None:
        return {}
    key = (int(culprit["step"]), culprit["name"], int(culprit["call_index"]))
    ea, eb = _entry(alone, *key), _entry(batched, *key)
    if ea.call is None or eb.call is None:
        return {"rule": rule.name, "rule_explanation": f"{backend.name}: the trace kept no call description"}
    try:
        env = _rule_env(device)
        pa = rule.predict(ea.call, ea.layout.index(0), env)
        pb = rule.predict(eb.call, eb.layout.index(pos), env)
        expected = rule.expect(pa.key, pb.key)
    except Exception as exc:  # a rule that cannot read the call is reported with the row
        return {"rule": rule.name, "rule_explanation": f"{backend.name}: the rule could not predict: {exc}"}
    return {
        "rule": rule.name,
        "rule_alone": pa.variant,
        "rule_batched": pb.variant,
        "rule_expected": expected,
        "rule_explanation": f"{backend.name}: {pa.variant} alone ({pa.reason}), {pb.variant} in the batch of "
        f"{size} ({pb.reason}); expected {expected}",
    }


def _layers(df: pd.DataFrame, num_layers: int) -> pd.DataFrame:
    """Per (step, layer): calls, outputs/inputs changed, culprits, the call to read first (a culprit,
    else the first changed function or lab op, else the first changed module).

    layer -1 holds calls before the decoder layers (the embedding, the root module's own), and
    `num_layers` those after them (the final norm, the head).
    """
    if df.empty:
        return pd.DataFrame(columns=LAYER_COLUMNS[7:])
    d = df[df.matched & (df.parent != "")]  # the root module spans every layer
    names = d.name.unique()
    numbers = {}
    for n in names:
        m = _LAYER.search(n)
        numbers[n] = int(m.group(1)) if m else None
    inside = [n for n in names if numbers[n] is not None]
    # modules that hold the layers (HF's `model`) span them too: the dotted prefixes of names inside
    holders = {n[:i] for n in inside for i, c in enumerate(n) if c == "."}
    d = d[~d.name.isin([n for n in names if numbers[n] is None and n in holders])]
    layer = d.name.map(numbers)
    in_layers = layer.notna()
    first = d.order[in_layers].min() if in_layers.any() else float("inf")
    layer = layer.where(in_layers, (d.order > first).map({True: num_layers, False: -1}))
    d = d.assign(layer=layer.astype(int), out_changed=d.changed_outputs != "", in_changed=d.changed_inputs != "")
    keys = ["step", "layer"]
    out = d.groupby(keys, sort=True).agg(
        calls=("name", "size"), outputs_changed=("out_changed", "sum"), inputs_changed=("in_changed", "sum"),
        culprits=("culprit", "sum"),
    )  # fmt: skip
    # the call to read first: a culprit, else the first changed call that is not a module
    # (a module starts before the calls inside it), else the first changed module
    changed = d[d.out_changed]
    rank = (~changed.culprit).astype(int) * (1 + (changed.kind == "module"))
    picks = changed.assign(rank=rank).sort_values([*keys, "rank", "order"]).drop_duplicates(keys).set_index(keys)
    out["first_changed"] = picks.name.reindex(out.index).fillna("")
    out = out.reset_index()
    out["layer_label"] = [
        "embed" if lay < 0 else "head" if lay >= num_layers else str(lay) for lay in out.layer
    ]  # fmt: skip
    return out.astype({c: int for c in ("step", "layer", "calls", "outputs_changed", "inputs_changed", "culprits")})[
        LAYER_COLUMNS[7:]
    ]


@dataclass
class Result:
    """A run's tables.

    Attributes:
        table: one row per compared response (COLUMNS).
        calls: per (mode, backend, kind, op): calls compared over every diffed response, how many
            changed, culprits (CALL_COLUMNS).
        layers: per diffed response, step and layer: calls, changed outputs, culprits, the first
            changed call (LAYER_COLUMNS), for the "where along the layers" plot.
    """

    table: pd.DataFrame
    calls: pd.DataFrame
    layers: pd.DataFrame


def _num_layers(runner: _Runner) -> int:
    if runner.kind == "hf":
        return int(runner.hf.config.num_hidden_layers)
    return runner.lab.config.num_layers


def run(cfg: Config, progress: bool = True, model: torch.nn.Module | None = None) -> Result:
    """Run a configured experiment: every batch of every mode, plain and with the control.

    Args:
        cfg: the experiment.
        progress: a tqdm bar on stderr.
        model: a Hugging Face causal LM built by the caller (from a config; any `*ForCausalLM`),
            exactly when cfg.model is "hf-custom"; it runs on its own device and dtype.

    Returns:
        A Result (see its attributes); rows carry `control_caught` and `insensitive` per mode.

    Raises:
        ValueError: a model given without cfg.model "hf-custom", or the other way round.
    """
    sweep = _Sweep(cfg, model)
    variants = [None] if sweep.control is None else [None, sweep.control]
    bar = tqdm(total=len(sweep.work) * len(variants), desc=f"model_invariance {cfg.model}", disable=not progress,
               leave=False)  # fmt: skip
    try:
        for variant in variants:
            with sweep.runner.switched(variant):
                for b in sweep.work:
                    sweep.compare(b, variant)
                    bar.update()
    finally:
        bar.close()
    table = pd.DataFrame(sweep.rows, columns=COLUMNS).astype({c: "Int64" for c in INT_COLUMNS})
    table = _with_sensitivity(table)
    return Result(table, _calls_table(sweep.calls), _layers_table(sweep.layers))


class _Sweep:
    """The runs of one experiment and the rows, call counts and layer tables they give."""

    def __init__(self, cfg: Config, model: torch.nn.Module | None = None) -> None:
        self.cfg = cfg
        self.runner = _Runner(cfg, model)
        self.control = cfg.control_spec
        self.work = batches(cfg, self.runner.vocab)
        self.info = detect(cfg.torch_device)
        self.n_layers = _num_layers(self.runner)
        self.root = type(self.runner.module).__name__
        self.rows: list[dict[str, Any]] = []
        self.calls: list[pd.DataFrame] = []
        self.layers: list[pd.DataFrame] = []
        self.alone_runs: dict[tuple, _Run] = {}

    def compare(self, b: Batch, variant: tuple[str, str] | None) -> None:
        """Run one batch (and the target alone, once per prompt and variant) and add its rows."""
        runner = self.runner
        key = (b.alone, variant)
        if key not in self.alone_runs:
            self.alone_runs[key] = _run(runner, [b.alone], [0])
        alone = self.alone_runs[key]
        batched = _run(runner, b.prompts, list(range(b.batch_size))) if alone.gen is not None else alone
        label = runner.label(variant)
        base = _base_row(self.cfg, runner, variant, label, b, self.info)
        diffs_left = MAX_DIFFS_PER_BATCH
        ran = (_ran(batched.trace) or ("torch (HF)" if runner.kind == "hf" else "")) if batched.gen is not None else ""
        for pos in b.compared:
            row = dict(base, comparison=len(self.rows), position=pos)
            self.rows.append(row)
            if batched.gen is None:
                status = "not covered" if not batched.covered else "error"
                row.update(status=status, covered=batched.covered, reason=batched.error)
                continue
            row.update(_outputs(alone.gen, batched.gen, pos))
            row["backend_ran"] = ran
            first = pos == b.compared[0]
            if not (first or (not row["bitwise_equal"] and diffs_left > 0)):
                continue
            diffs_left -= not first
            df, row["trace_note"] = _diff(alone.trace, batched.trace, pos)
            row.update(
                _culprit_columns(df, alone.trace, batched.trace, pos, b.batch_size, variant, self.cfg, self.root)
            )
            is_control = variant is not None
            self.calls.append(summarize_calls(df).assign(mode=b.mode, backend=label, is_control=is_control))
            ids = dict(comparison=row["comparison"], mode=b.mode, backend=label, is_control=is_control,
                       batch_size=b.batch_size, target_len=b.target_len, position=pos)  # fmt: skip
            self.layers.append(_layers(df, self.n_layers).assign(**ids))


def _base_row(cfg: Config, runner: _Runner, variant, label: str, b: Batch, info) -> dict[str, Any]:
    used = runner.libraries(variant)
    amd = any(u.library.amd for u in used)
    dtype = checks.dtype_name(runner.dtype)
    return dict.fromkeys(COLUMNS) | {
        "model": runner.hf.name if runner.kind == "hf" else cfg.model, "model_kind": runner.kind, "mode": b.mode, "backend": label,
        "backends": runner.backends_text(variant), "is_control": variant is not None,
        "control": f"{variant[0]}:{variant[1]}" if variant else "", "covered": True, "status": "compared",
        "reason": "", "device": info.name, "arch": info.arch, "platform": info.platform, "dtype": dtype,
        "kv_dtype": dtype, "level": cfg.level, "target_len": b.target_len, "batch_size": b.batch_size,
        "trial": b.trial, "seed": cfg.seed, "batch_tokens": sum(len(p) for p in b.prompts),
        "batch_max_len": max(len(p) for p in b.prompts), "max_new_tokens": cfg.max_new_tokens, "traced": False,
        "library": ", ".join(sorted({u.library.name for u in used})) or "torch",
        "hardware_note": routing.HARDWARE_NOTE if amd and info.platform != "rocm" else "",
    }  # fmt: skip


def _ran(trace: Trace | None) -> str:
    if trace is None:
        return ""
    seen = dict.fromkeys((e.op, e.backend) for e in trace.entries if e.kind == "lab_op")
    return "; ".join(f"{op}={b}" for op, b in seen)


def _diff(alone: Trace, batched: Trace, pos: int) -> tuple[pd.DataFrame, str]:
    try:
        return diff(alone, batched, 0, pos), ""
    except ValueError as exc:  # the two runs took different code paths: compare what matches
        return diff(alone, batched, 0, pos, strict=False), str(exc).split(". Record")[0][:200]


def _culprit_columns(
    df: pd.DataFrame, alone: Trace, batched: Trace, pos: int, size: int, variant, cfg: Config, root: str
) -> dict[str, Any]:
    found = df[df.culprit]
    roots = df[(df.name == root) & (df.parent == "") & df.matched]
    out: dict[str, Any] = {
        "traced": True,
        "logits_equal": bool(roots.output_equal.all()) if not roots.empty else None,
        "n_culprits": len(found),
        "culprits": "; ".join(dict.fromkeys(found.name)),
        "calls_compared": int(df.matched.sum()),
        "calls_changed": int((df.changed_outputs != "").sum()),
    }
    if variant is not None:
        op, backend = variant
        out["control_named"] = bool(((found.kind == "lab_op") & (found.op == op) & (found.backend_b == backend)).any())
    c = first_culprit(df)
    if c is not None:
        out.update(
            step=int(c["step"]), culprit_name=c["name"], culprit_kind=c["kind"], culprit_op=c["op"],
            culprit_backend=c["backend_b"], culprit_module=c["module"],
        )  # fmt: skip
        out.update(_rule_columns(c, alone, batched, pos, size, cfg.torch_device))
    leaves = _leaf_modules(df[df.matched])
    changed = leaves[leaves.changed_outputs != ""].sort_values("order")
    if not changed.empty:
        out["first_changed_module"] = changed.name.iloc[0]
        out["first_changed_module_input_equal"] = bool(changed.input_equal.iloc[0])
    if cfg.level == "ops":
        mc = first_culprit(diff(alone, batched, 0, pos, strict=False, kinds=("module",)))
        out["module_culprit"] = mc["name"] if mc is not None else None
    elif c is not None:
        out["module_culprit"] = c["name"]
    return out


def _calls_table(parts: list[pd.DataFrame]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame(columns=CALL_COLUMNS)
    d = pd.concat(parts, ignore_index=True)
    keys = ["mode", "backend", "is_control", "kind", "op"]
    out = d.groupby(keys, sort=False).agg(
        comparisons=("compared", "size"), compared=("compared", "sum"), inputs_changed=("inputs_changed", "sum"),
        outputs_changed=("outputs_changed", "sum"), unaligned=("unaligned", "sum"), culprits=("culprits", "sum"),
    )  # fmt: skip
    return out.reset_index()[CALL_COLUMNS]


def _layers_table(parts: list[pd.DataFrame]) -> pd.DataFrame:
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=LAYER_COLUMNS)
    return pd.concat(parts, ignore_index=True)[LAYER_COLUMNS]


def _with_sensitivity(df: pd.DataFrame) -> pd.DataFrame:
    """control_caught per mode: a control comparison that names the control among its culprits and
    whose model output changed (the token ids, the logprobs, or the logits hashed at the model's root)."""
    caught: dict[str, bool | None] = {}
    for mode in df["mode"].unique():
        ctrl = df[(df["mode"] == mode) & df.is_control.astype(bool) & (df.status == "compared")]
        changed = ~ctrl.bitwise_equal.astype(bool) | ctrl.logits_equal.eq(False)
        caught[mode] = None if ctrl.empty else bool((changed & ctrl.control_named.eq(True)).any())
    df["control_caught"] = df["mode"].map(caught).astype(object)
    df["insensitive"] = df["mode"].map(lambda m: caught[m] is not True).astype(bool)
    return df


def model_invariance(*, progress: bool = True, **kwargs: Any) -> Result:
    """Run the experiment from plain values (the fields of `Config`); see `run`."""
    return run(Config(**kwargs), progress=progress)


# -- reading the tables --


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, mode, backend): responses compared and equal, the verdict, the first culprit seen.

    verdict: "invariant" (every response equal and no culprit in any diffed trace), "hash-only
    culprits" (equal responses, but some call's bits changed inside), "variant"; for a control:
    "caught" or "NOT caught"; "error" / "not covered" when nothing ran.
    """
    out = []
    for (model, mode, backend), part in table.groupby(["model", "mode", "backend"], sort=False):
        done = part[part.status == "compared"]
        is_control = bool(part.is_control.iloc[0])
        equal = int(done.bitwise_equal.astype(bool).sum())
        culprits = int(done.n_culprits.fillna(0).sum())
        named = done[done.culprit_name.notna()]
        if done.empty:
            verdict = part.status.iloc[0]
        elif is_control:
            verdict = "caught" if bool(part.control_caught.iloc[0]) else "NOT caught"
        elif equal < len(done):
            verdict = "variant"
        else:
            verdict = "invariant" if culprits == 0 else "hash-only culprits"
        first = named.sort_values(["first_diff_step", "step"], na_position="last").iloc[0] if not named.empty else None
        out.append(
            {
                "model": model, "mode": mode, "backend": backend, "is_control": is_control,
                "responses": len(done), "bitwise_equal": equal, "differ": len(done) - equal,
                "culprits": culprits, "calls_compared": int(done.calls_compared.fillna(0).sum()),
                "verdict": verdict, "insensitive": bool(part.insensitive.iloc[0]),
                "first_culprit": first["culprit_name"] if first is not None else "",
                "culprit_backend": first["culprit_backend"] if first is not None else "",
                "step": _int(first["step"]) if first is not None else None,
                "first_diff_step": _int(done.first_diff_step.min()),
                "reason": part.reason.iloc[0] if done.empty else "",
            }
        )  # fmt: skip
    return pd.DataFrame(out).astype({"step": "Int64", "first_diff_step": "Int64"}) if out else pd.DataFrame(out)


def _int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def blame(table: pd.DataFrame) -> pd.DataFrame:
    """The responses that differ or carry a culprit, with who is blamed at each level: the op-level
    culprit, the module-level culprit (modules hooks only), and the first module whose output
    changed (what a hook that does not check inputs would blame) with whether its input had changed."""
    cols = ["model", "mode", "backend", "batch_size", "target_len", "position", "bitwise_equal", "first_diff_step",
            "token", "step", "culprit_name", "culprit_kind", "culprit_backend", "module_culprit",
            "first_changed_module", "first_changed_module_input_equal", "n_culprits", "rule_explanation"]  # fmt: skip
    done = table[(table.status == "compared") & table.traced.astype(bool)]
    keep = done[~done.bitwise_equal.astype(bool) | (done.n_culprits.fillna(0) > 0)]
    return keep[cols].reset_index(drop=True)


def calls_by_kind(calls: pd.DataFrame) -> pd.DataFrame:
    """Calls compared per kind (lab ops per op), with the invariant backends and with the control:
    how many, how many changed the request's bits, culprits."""
    if calls.empty:
        return pd.DataFrame(columns=["kind", "op", "run", "compared", "outputs_changed", "culprits"])
    d = calls.assign(
        op=calls.op.where(calls.kind == "lab_op", ""), run=calls.is_control.map({True: "control", False: "invariant"})
    )
    out = d.groupby(["kind", "op", "run"], sort=True)[["compared", "outputs_changed", "culprits"]].sum()
    return out.reset_index()


def _where(r: Any) -> str:
    where = f"step {int(r.step)}" + (" (the prefill)" if int(r.step) == 0 else "")
    return f"`{r.culprit_name}` ({r.culprit_kind}{', ' + r.culprit_backend if isinstance(r.culprit_backend, str) else ''}) at {where}"


def headline(*tables: pd.DataFrame) -> str:
    """One line for the suite index, from one or more run tables."""
    parts = []
    for table in tables:
        if table is None or table.empty:
            continue
        s = summarize(table)
        tested = s[~s.is_control]
        ctrl = s[s.is_control]
        model = table.model.iloc[0]
        variant = tested[tested.verdict == "variant"]
        if tested.responses.sum() == 0:
            parts.append(f"{model}: not run ({tested.reason.iloc[0] if not tested.empty else 'nothing compared'})")
            continue
        if variant.empty:
            text = f"{model}: {int(tested.responses.sum())} responses bitwise equal alone and batched"
            hidden = int(tested.culprits.sum())
            text += f" ({hidden} hash-level culprits)" if hidden else " (0 culprits)"
        else:
            first = variant.iloc[0]
            text = f"{model}: {int(variant.differ.sum())}/{int(tested.responses.sum())} responses differ, first culprit {first.first_culprit}"
        if ctrl.empty:
            text += ", NO control"
        else:
            caught = sorted(set(ctrl[ctrl.verdict == "caught"]["mode"]))
            missed = sorted(set(ctrl[ctrl.verdict != "caught"]["mode"]))
            text += f", control {ctrl.backend.iloc[0]} caught in {fmt_list(caught)}"
            if missed:
                text += f"; INSENSITIVE: {', '.join(missed)}"
        parts.append(text)
    return "; ".join(parts) or "nothing ran"


def conclusion(table: pd.DataFrame, calls: pd.DataFrame | None = None, real: pd.DataFrame | None = None) -> str:
    """A markdown conclusion computed from the tables (the notebook's last cell shows it).

    Args:
        table: the main run (`Result.table`).
        calls: its `Result.calls` (for how many calls of each kind were compared).
        real: a run of a real model (an HF model on its own torch code), if any.
    """
    lines = ["## Conclusion", ""]
    for t in (table, real):
        if t is None or t.empty:
            continue
        s = summarize(t)
        model, kind = t.model.iloc[0], t.model_kind.iloc[0]
        lines.append(
            f"**{model}** ({'Hugging Face, its own torch code' if kind == 'hf' else 'the lab model'}, {t.dtype.iloc[0]}, trace level {t.level.iloc[0]})"
        )
        for r in s[~s.is_control].itertuples():
            if r.verdict in ("error", "not covered"):
                lines.append(f"- {r.mode}, {r.backend}: {r.verdict}: {r.reason}")
            elif r.verdict == "variant":
                lines.append(f"- {r.mode}, {r.backend}: **{r.differ} of {r.responses} responses differ**")
            else:
                extra = f", but {r.culprits} hash-level culprits" if r.culprits else ", 0 culprits"
                lines.append(
                    f"- {r.mode}, {r.backend}: all {r.responses} responses bitwise equal{extra} over {r.calls_compared} calls compared"
                )
        for r in blame(t[~t.is_control.astype(bool)]).drop_duplicates(["mode", "culprit_name"]).head(6).itertuples():
            if not isinstance(r.culprit_name, str):
                lines.append(
                    f"  - {r.mode}, batch {r.batch_size}: output differs from step {r.first_diff_step}, no culprit found (the change arose where rows could not be compared per request)"
                )
                continue
            text = f"  - {r.mode}, batch {r.batch_size}, {r.target_len} tokens: the op level names {_where(r)}"
            if pd.notna(r.first_diff_step):
                text += f"; the output first differs at step {int(r.first_diff_step)}"
                text += f", the token ids at step {int(r.token)}" if pd.notna(r.token) else ", the token ids never"
            if isinstance(r.module_culprit, str) and r.module_culprit != r.culprit_name:
                text += f". Module hooks alone name `{r.module_culprit}`"
            if (
                isinstance(r.first_changed_module, str)
                and pd.notna(r.first_changed_module_input_equal)
                and not r.first_changed_module_input_equal
            ):
                text += f"; the first module whose output changed, `{r.first_changed_module}`, had a changed input"
            if isinstance(r.rule_explanation, str):
                text += f". Rule: {r.rule_explanation}"
            lines.append(text)
        ctrl = s[s.is_control]
        if ctrl.empty:
            lines.append("- **no batch-variant control ran: this run cannot show that it would see variance**")
        for r in ctrl.itertuples():
            if r.verdict == "caught":
                lines.append(
                    f"- control {r.backend} ({r.mode}): caught, first culprit `{r.first_culprit}` at step {r.step}; "
                    + (
                        f"the output first differs at step {r.first_diff_step}"
                        if pd.notna(r.first_diff_step)
                        else "the logits changed, the token ids and logprobs did not"
                    )
                )
            else:
                lines.append(
                    f"- control {r.backend} ({r.mode}): **NOT caught: this mode's equalities prove nothing (insensitive)**"
                )
        lines.append("")
    if calls is not None and not calls.empty:
        plain = calls[~calls.is_control.astype(bool)]
        kinds = plain.groupby("kind").compared.sum()
        lab = plain[plain.kind == "lab_op"].groupby("op").compared.sum()
        lines.append(
            "Calls compared with invariant backends: "
            + ", ".join(f"{k} {int(v)}" for k, v in kinds.items())
            + (" (lab ops: " + ", ".join(f"{op} {int(v)}" for op, v in lab.items()) + ")" if not lab.empty else "")
            + f"; culprits {int(plain.culprits.sum())}."
        )
    return "\n".join(lines)


# -- notebook 05's parameters --


@dataclass(frozen=True, kw_only=True)
class NotebookConfig(ExperimentConfig):
    """Notebook 05_layer_hash_bisect's own parameters, one typed schema checked when built.

    Attributes:
        seed, device: as every notebook's.
        model, num_layers, dtype, backends, modes, prompt_lens, prefix_lens, batch_sizes,
            max_new_tokens, min_len, max_len, level, control: the lab-model run (`Config`).
        real_model: a Hugging Face builder whose own torch code is searched for a real culprit
            (None: the section is skipped).
        real_num_layers, real_modes, real_prompt_lens, real_batch_sizes, real_max_new_tokens,
            real_control: that run's `Config` fields (its trace level is "ops", and the module
            level is read from the same traces).
    """

    model: str = field(default="tiny", metadata=check(_known_model, "the lab model preset"))
    num_layers: int | None = field(default=None, metadata=check(positive))
    dtype: str | None = field(default=None, metadata=check(one_of(DTYPES)))
    backends: dict[str, str] | None = None
    modes: tuple[str, ...] = field(default=MODES, metadata=check(_known_modes))
    prompt_lens: tuple[int, ...] = field(default=(9,), metadata=check(positive_ints))
    prefix_lens: tuple[int, ...] | None = field(default=None, metadata=check(positive_ints))
    batch_sizes: tuple[int, ...] = field(default=(2, 4), metadata=check(positive_ints))
    max_new_tokens: int = field(default=4, metadata=check(positive))
    min_len: int = field(default=1, metadata=check(positive))
    max_len: int = field(default=24, metadata=check(positive))
    level: str = field(default="ops", metadata=check(one_of(LEVELS)))
    control: str | None = AUTO
    real_model: str | None = field(default=None, metadata=check(_known_model, "an HF builder"))
    real_num_layers: int | None = field(default=None, metadata=check(positive))
    real_modes: tuple[str, ...] = field(default=("single",), metadata=check(_known_modes))
    real_prompt_lens: tuple[int, ...] = field(default=(9,), metadata=check(positive_ints))
    real_batch_sizes: tuple[int, ...] = field(default=(2,), metadata=check(positive_ints))
    real_max_new_tokens: int = field(default=2, metadata=check(positive))
    real_control: str | None = AUTO

    def validate(self) -> None:
        super().validate()
        if self.real_model is not None and not hf_models.is_hf(self.real_model):
            raise ValueError(
                f"real_model: {self.real_model!r} is not a Hugging Face builder; accepted: {', '.join(hf_models.BUILDERS)}"
            )
        self.experiment()  # every field of both runs checked now, before anything runs
        self.real_experiment()

    def experiment(self) -> Config:
        """The lab-model run."""
        return Config(
            seed=self.seed, device=self.device, model=self.model, num_layers=self.num_layers, dtype=self.dtype,
            backends=self.backends, modes=self.modes, prompt_lens=self.prompt_lens, prefix_lens=self.prefix_lens,
            batch_sizes=self.batch_sizes,
            max_new_tokens=self.max_new_tokens, min_len=self.min_len, max_len=self.max_len, level=self.level,
            control=self.control,
        )  # fmt: skip

    def run_real(self, progress: bool = True) -> Result:
        """The real model's run: empty tables when `real_model` is None, one not-covered row when
        transformers is not installed."""
        cfg = self.real_experiment()
        empty = (pd.DataFrame(columns=CALL_COLUMNS), pd.DataFrame(columns=LAYER_COLUMNS))
        if cfg is None:
            return Result(pd.DataFrame(columns=COLUMNS), *empty)
        try:
            import transformers  # noqa: F401
        except ImportError:
            row = dict.fromkeys(COLUMNS) | {
                "model": cfg.model, "model_kind": "hf", "mode": cfg.modes[0], "backend": "torch (HF)",
                "is_control": False, "covered": False, "status": "not covered", "reason": hf_models.HINT,
                "seed": cfg.seed, "level": cfg.level, "traced": False, "insensitive": True,
                "dtype": checks.dtype_name(cfg.model_dtype),
            }  # fmt: skip
            return Result(pd.DataFrame([row], columns=COLUMNS), *empty)
        return run(cfg, progress=progress)

    def real_experiment(self) -> Config | None:
        """The real model's run, or None."""
        if self.real_model is None:
            return None
        return Config(
            seed=self.seed, device=self.device, model=self.real_model, num_layers=self.real_num_layers,
            modes=self.real_modes, prompt_lens=self.real_prompt_lens, batch_sizes=self.real_batch_sizes,
            max_new_tokens=self.real_max_new_tokens, level="ops", control=self.real_control,
        )  # fmt: skip
