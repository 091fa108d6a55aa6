"""The conformance vectors driven through every path that runs on a CPU.

Each ``run_*`` replays one :class:`vectors.Case` and returns a :class:`Trace`: the outputs of every
decode / verify step and the final per-sequence state (rings, cursors, checkpoint and read-copy
bytes) in logical sequence order, so traces of different paths compare element by element.

| path          | what runs                                                                   |
|---------------|-----------------------------------------------------------------------------|
| ``oracle``    | the fp64 step recurrence (``tests/helpers.step_oracle``)                    |
| ``reference`` | ``StatePool(backend="reference")``, ``replayssm.decode`` / ``verify`` / commit |
| ``triton``    | ``StatePool(backend="triton")`` (Triton's interpreter on a CPU)             |
| ``sglang-*``  | SGLang's ``HybridReqToTokenPool`` with the plugin's pool, SGLang's call sites |
| ``transformers`` | ``ReplayCache`` through transformers' routed recurrent functions         |
| ``trtllm-adapter`` | ``ReplayMambaStates`` over a TRT-LLM-shaped ``temporal`` (its calls as the |
|               | layers' call sites and ``update_mamba_states`` make them)                   |
| ``trt-ptx``   | the TensorRT plugin layers' PTX over a pool's buffers (CUDA only; on a CPU  |
|               | with the torch ops in place of the driver launch)                           |
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

import replayssm as rs
from helpers import PER_LAYER, step_oracle
from vectors import INIT_SEQS, NUM_LAYERS, Case, Step


@dataclass
class Trace:
    """What one path produced for one case.

    outputs: per decode / verify step, ``[n, (T,) heads, dim]`` (padded rows included; the
        transformers path has no padding and leaves those rows NaN).
    state: ``"ring.x"``, ``"cursor.count"``, ``"checkpoint"``, ``"read.codes"`` ... ->
        ``[num_seqs, ...]`` in logical sequence order (canonical checkpoint layout).
    launches: the Triton launches of the steps, in order (``replayssm.kernels.plan.Launch``).
    """

    outputs: list
    state: dict = field(default_factory=dict)
    launches: list = field(default_factory=list)


def _out(case: Case, step: Step) -> torch.Tensor:
    """A NaN-poisoned output buffer ``[n, (T,) heads, dim]`` in the ring dtype."""
    spec = case.spec
    heads, dim = (spec.num_heads, spec.head_dim) if spec.family == "mamba2" else (spec.num_v_heads, spec.head_v_dim)
    lead = (len(step.rows),) if step.tokens is None else (len(step.rows), step.tokens)
    return torch.full((*lead, heads, dim), float("nan"), dtype=case.cfg.torch_ring_dtype)


def _snapshot(pool: rs.StatePool, phys: list[int]) -> dict:
    """Layer 0's rings, cursors, read copy and checkpoint of slots ``phys`` (logical order), copied
    to the CPU."""
    idx = torch.tensor(phys, device=pool.device)
    state = {f"ring.{k}": v[0, idx].cpu() for k, v in pool.ring.items()}
    state.update({f"cursor.{k}": v[0, idx].cpu() for k, v in pool.cursors.items()})
    state.update({f"read.{k}": v[0, idx].cpu() for k, v in pool.read.items()})
    state["checkpoint"] = pool.checkpoint[0, idx].contiguous().cpu()
    return state


def _slots(table: dict, rows: list[int]) -> torch.Tensor:
    return torch.tensor([table[r] if r >= 0 else -1 for r in rows], dtype=torch.int64)


def run_oracle(case: Case) -> tuple[list, list]:
    """fp64 step recurrence: (outputs per step, ungated outputs per step for Mamba-2 else None).

    Outputs are ``[n, (T,) heads, dim]`` fp64 with zeros on padded rows; a verify advances each
    sequence by its accepted prefix."""
    state = {i: case.init_state[i].double() for i in range(INIT_SEQS)}
    outs, plain = [], []
    for step in case.steps:
        if step.kind == "fork":
            for src, dst in zip(step.rows, step.children):
                state[dst] = state[src].clone()
            continue
        if step.kind == "flush":
            continue
        T = step.tokens or 1
        f64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in step.inputs.items()}
        ys, ys_plain = [], []
        for i, row in enumerate(step.rows):
            if row < 0:
                continue
            S = state[row][None]
            for t in range(T):
                tok = {k: (v[i:i + 1] if step.tokens is None else v[i:i + 1, t]) if isinstance(v, torch.Tensor)
                       and v.dim() > 1 else v for k, v in f64.items()}
                y, S_next = step_oracle(case.spec, S, tok)
                ys.append(y[0])
                if "z" in tok:
                    ys_plain.append(step_oracle(case.spec, S, dict(tok, z=None))[0][0])
                S = S_next
                if step.tokens is None or t + 1 == int(step.accepted[i]):
                    state[row] = S[0]
        outs.append(_scatter(step, ys, T))
        plain.append(_scatter(step, ys_plain, T) if ys_plain else None)
    return outs, plain


def _scatter(step: Step, ys: list, T: int) -> torch.Tensor:
    """Per-token rows of the live sequences back to ``[n, (T,) ...]`` with zero padded rows."""
    live = torch.stack(ys).view(-1, T, *ys[0].shape)
    full = torch.zeros(len(step.rows), T, *ys[0].shape, dtype=live.dtype)
    full[torch.tensor([r >= 0 for r in step.rows])] = live
    return full if step.tokens is not None else full[:, 0]


@contextlib.contextmanager
def recorded_launches():
    """Record every Launch ``replayssm.kernels.ops`` runs while inside (the list is yielded)."""
    from replayssm.kernels import ops
    seen, original = [], ops.launch

    def launch(plan):
        seen.extend(plan)
        original(plan)

    ops.launch = launch
    try:
        yield seen
    finally:
        ops.launch = original


def run_pool(case: Case, backend: str, device="cpu") -> Trace:
    """``StatePool(backend)`` on ``device`` driven by ``replayssm.decode`` / ``verify`` /
    ``pool.commit`` / ``pool.fork`` / ``pool.flush``; slots of the initial sequences written by
    ``write_state``. The trace is on the CPU."""
    pool = rs.StatePool(case.spec, case.cfg, num_layers=NUM_LAYERS, num_slots=case.num_seqs + 1, device=device,
                        backend=backend)
    first = pool.alloc(INIT_SEQS)
    pool.write_state(0, first, case.init_state.to(device))
    table = dict(enumerate(first.tolist()))
    trace = Trace([])
    with contextlib.ExitStack() as stack:
        if backend == "triton":
            trace.launches = stack.enter_context(recorded_launches())
        for step in case.steps:
            slots = _slots(table, step.rows).to(device)
            if step.kind == "fork":
                table.update(zip(step.children, pool.fork(slots).tolist()))
            elif step.kind == "flush":
                pool.flush(slots)
            else:
                fn = rs.decode if step.kind == "decode" else rs.verify
                inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in step.inputs.items()}
                trace.outputs.append(fn(pool, 0, slots, out=_out(case, step).to(device), **inputs).cpu())
                if step.kind == "verify":
                    pool.commit(slots, step.accepted)
    trace.state = _snapshot(pool, [table[i] for i in range(case.num_seqs)])
    return trace


_STEP_STATE = ("checkpoint", "count", "origin", "epoch", "slots", "out")


def trt_ptx_uncovered(case: Case) -> str | None:
    """Why the TensorRT plugin layers cannot run ``case`` as scripted, or None. Their inputs are
    fixed by ``steps.step_buffers``: every step input in the dtype declared there (Mamba-2's D and
    dt_bias present), and a GDN / KDA ``scale`` equal to the compiled-in ``head_k_dim ** -0.5``."""
    from replayssm.integrations.trtllm import steps
    for j, step in enumerate(s for s in case.steps if s.kind in ("decode", "verify")):
        has_z = case.family == "mamba2" and step.inputs.get("z") is not None
        for name, (_, dtype) in steps.step_buffers(case.spec, case.cfg, step.tokens or 1, has_z=has_z).items():
            if name in _STEP_STATE or name.startswith(("ring_", "read_")):
                continue
            value = step.inputs.get(name)
            if value is None:
                return f"step {j}: no {name}; the plugin layers take it"
            if value.dtype != dtype:
                return f"step {j}: {name} is {value.dtype}; the plugin layers take {dtype}"
        scale = step.inputs.get("scale")
        if scale is not None and scale != case.spec.head_k_dim ** -0.5:
            return f"step {j}: scale {scale:g}; the plugin layers compile in head_k_dim ** -0.5"
    return None


@functools.lru_cache(maxsize=None)
def _ptx_step(spec, cfg, op: str, tokens: int, has_z: bool, device: torch.device):
    """The plugin layers of one step, built for ``device``'s arch and loaded there (``ptx_launch``)."""
    from replayssm.integrations.trtllm import ptx_launch
    arch = "sm_%d%d" % torch.cuda.get_device_capability(device)
    manifest = ptx_launch.build_step(spec, cfg, op=op, tokens=tokens, has_z=has_z, arch=arch)
    return ptx_launch.PtxStep(manifest, device)


def _plugin_buffers(pool: rs.StatePool, slots: torch.Tensor, inputs: dict, out: torch.Tensor) -> dict:
    """Layer 0's checkpoint, read copy, rings and cursors and one step's tensors (token axis
    included), by ``steps.step_buffers`` name (and ``pending``)."""
    bufs = {"checkpoint": pool.checkpoint[0], "slots": slots, "out": out}
    bufs.update({f"read_{k}": v[0] for k, v in pool.read.items()})
    bufs.update({f"ring_{k}": v[0] for k, v in pool.ring.items()})
    bufs.update({k: v[0] for k, v in pool.cursors.items()})
    bufs.update(inputs)
    return bufs


def run_trt_ptx(case: Case, device="cuda", launcher=None) -> Trace:
    """The TensorRT AOT path without TensorRT, over the layer-0 buffers of a
    ``StatePool(backend="triton")``: each decode / verify is its three plugin layers
    (``plugin_desc.describe_step``, layer 0, Mamba-2 with its gate), run on the named buffers by
    ``launcher(spec, cfg, op, tokens, has_z)(buffers)``; by default ``ptx_launch.PtxStep`` of the
    PTX built for the device's arch, launched through the CUDA driver. What TensorRT leaves to the
    host goes through the pool between launches (README, TensorRT-LLM, Recipe A): the initial
    ``write_state``, the commit after a verify (``pool.commit(checked=False)``, the
    ``torch.ops.replayssm.commit`` cursor move), ``fork`` and ``flush``; for Mamba-2 the host
    records the layer's A for the pool's fold, as the pool's own steps do. Raises ValueError for a
    case :func:`trt_ptx_uncovered` refuses. The trace is on the CPU (no launches recorded)."""
    reason = trt_ptx_uncovered(case)
    if reason is not None:
        raise ValueError(f"case: {case.name} is not covered by the plugin layers: {reason}")
    launcher = launcher or functools.partial(_ptx_step, device=torch.device(device))
    pool = rs.StatePool(case.spec, case.cfg, num_layers=NUM_LAYERS, num_slots=case.num_seqs + 1, device=device,
                        backend="triton")
    first = pool.alloc(INIT_SEQS)
    pool.write_state(0, first, case.init_state.to(device))
    table = dict(enumerate(first.tolist()))
    trace = Trace([])
    for step in case.steps:
        slots = _slots(table, step.rows).to(device)
        if step.kind == "fork":
            table.update(zip(step.children, pool.fork(slots).tolist()))
            continue
        if step.kind == "flush":
            pool.flush(slots)
            continue
        inputs = {k: v.to(device) for k, v in step.inputs.items() if isinstance(v, torch.Tensor)}
        if step.tokens is None:  # decode: a token axis of one, as replayssm.decode adds it
            inputs = {k: (v if k in PER_LAYER else v.unsqueeze(1)) for k, v in inputs.items()}
        out = _out(case, step).to(device)
        if case.family == "mamba2":
            pool.layer_A[0] = inputs["A"]
        launcher(case.spec, case.cfg, step.kind, step.tokens or 1, "z" in inputs)(
            _plugin_buffers(pool, slots, inputs, out if step.tokens else out.unsqueeze(1)))
        trace.outputs.append(out.cpu())
        if step.kind == "verify":
            pool.commit(slots, step.accepted.to(device), checked=False)
    trace.state = _snapshot(pool, [table[i] for i in range(case.num_seqs)])
    return trace


def _sglang_req_pool(case: Case):
    """SGLang's own ``HybridReqToTokenPool`` (one linear layer, id 0) with the plugin's pool class."""
    from sglang.srt.configs.mamba_utils import (KimiLinearCacheParams, KimiLinearStateShape, Mamba2CacheParams,
                                                Mamba2StateDType, Mamba2StateShape)
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    spec, dtype = case.spec, Mamba2StateDType(conv=torch.float32, temporal=case.cfg.torch_checkpoint_dtype)
    if spec.family == "mamba2":
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=spec.num_heads * spec.head_dim,
                                        n_groups=spec.num_groups, num_heads=spec.num_heads, head_dim=spec.head_dim,
                                        state_size=spec.state_dim, conv_kernel=4)
        params = Mamba2CacheParams(shape=shape, layers=[0], dtype=dtype)
    elif spec.family == "gdn":
        HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * V, n_groups=HK, num_heads=HV,
                                        head_dim=V, state_size=K, conv_kernel=4,
                                        conv_shard_groups=[HK * K, HK * K, HV * V])
        params = Mamba2CacheParams(shape=shape, layers=[0], dtype=dtype)
    else:
        shape = KimiLinearStateShape.create(tp_world_size=1, num_heads=spec.num_v_heads, head_dim=spec.head_v_dim,
                                            num_k_heads=spec.num_k_heads, head_k_dim=spec.head_k_dim,
                                            conv_kernel_size=4)
        params = KimiLinearCacheParams(shape=shape, layers=[0], dtype=dtype)
    drafts = case.cfg.max_tokens if case.cfg.max_draft_tokens else None
    return HybridReqToTokenPool(size=8, mamba_size=case.num_seqs + 2, mamba_spec_state_size=8, max_context_len=64,
                                device="cpu", enable_memory_saver=False, cache_params=params, mamba_layer_ids=[0],
                                enable_mamba_extra_buffer=False, speculative_num_draft_tokens=drafts)


def _sglang_step(case: Case, step: Step, temporal: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One decode / verify through SGLang's call site of the family; returns ``[n, (T,) heads, dim]``."""
    idx = slots.to(torch.int32)
    n, T = len(step.rows), step.tokens
    if case.family == "mamba2":
        from sglang.srt.layers.attention.mamba import mamba as mamba_mod
        from test_sglang_replay import _sglang_args
        out = _out(case, step)
        args, kw = _sglang_args(step.inputs, slots, out, verify_T=T)
        kw["z"] = step.inputs["z"]
        return mamba_mod.selective_state_update(temporal, *args, **kw)
    spec, raw = case.spec, step.raw
    HV, K, V = spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    A_log = torch.zeros(HV)
    dt_bias = torch.zeros(HV) if case.family == "gdn" else torch.zeros(HV * K)
    if case.family == "gdn":
        from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel as Kernel
    else:
        from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel as Kernel
    b = raw["b"].reshape(-1, HV) if case.family == "gdn" else raw["b"].reshape(1, -1, HV)
    a = raw["a"].reshape(-1, HV) if case.family == "gdn" else raw["a"].reshape(-1, HV * K)
    if T is None:
        mixed = torch.cat([raw[k].flatten(1) for k in ("q", "k", "v")], dim=1)
        out = Kernel().packed_decode(mixed, a, b, A_log=A_log, dt_bias=dt_bias, scale=K ** -0.5, ssm_states=temporal,
                                     cache_indices=idx, num_v_heads=HV, head_v_dim=V, replayssm_d=None,
                                     replayssm_k=None, replayssm_g=None, replayssm_write_pos=None,
                                     replayssm_force_flush=None)
        return out[0]
    flat = {k: raw[k].flatten(0, 1).unsqueeze(0) for k in ("q", "k", "v")}
    out = Kernel().target_verify(A_log=A_log, dt_bias=dt_bias, q=flat["q"], k=flat["k"], v=flat["v"], a=a, b=b,
                                 ssm_states=temporal, cache_indices=idx,
                                 query_start_loc=torch.arange(n + 1, dtype=torch.int32) * T,
                                 intermediate_states_buffer=None, intermediate_state_indices=None, cache_steps=T,
                                 retrieve_parent_token=None)
    return out[0].unflatten(0, (n, T))


def run_sglang(case: Case, backend: str) -> Trace:
    """The plugin's pool inside SGLang's ``HybridReqToTokenPool``: slots from SGLang's allocator,
    the prefill write + its refresh (``extend end``), steps through SGLang's call sites (Mamba-2
    ``selective_state_update``; GDN / KDA ``packed_decode`` and ``target_verify`` of SGLang's
    kernel classes), fork as SGLang's ``copy_from`` (the ring carried with the checkpoint) and flush
    as ``get_cpu_copy`` (which flushes first), commit on the pool's StatePool (what ``commit_after_verify`` ends with)."""
    from replayssm.integrations.sglang import hooks
    from replayssm.integrations.sglang import pool as replay_pool
    hooks.install(case.cfg, backend=backend)
    try:
        req_pool = _sglang_req_pool(case)
        mp = req_pool.mamba_pool
        temporal = req_pool.mamba2_layer_cache(0).temporal
        first = req_pool.mamba_allocator.alloc(INIT_SEQS)
        init = case.init_state.transpose(-1, -2) if case.spec.is_delta else case.init_state
        temporal[first] = init.to(temporal.dtype)
        replay_pool.on_state("extend end", temporal, first)
        table = dict(enumerate(first.tolist()))
        trace = Trace([])
        with contextlib.ExitStack() as stack:
            if backend == "triton":
                trace.launches = stack.enter_context(recorded_launches())
            for step in case.steps:
                slots = _slots(table, step.rows)
                if step.kind == "fork":
                    dst = req_pool.mamba_allocator.alloc(len(step.rows))
                    mp.copy_from(slots, dst)
                    table.update(zip(step.children, dst.tolist()))
                elif step.kind == "flush":
                    mp.get_cpu_copy(slots)
                else:
                    trace.outputs.append(_sglang_step(case, step, temporal, slots))
                    if step.kind == "verify":   # as commit_after_verify does: sync-free on Triton
                        mp.replay.commit(slots.to(mp.replay.device), step.accepted.to(mp.replay.device),
                                         checked=replay_pool.checked(mp.replay))
        trace.state = _snapshot(mp.replay, [table[i] for i in range(case.num_seqs)])
        return trace
    finally:
        hooks.uninstall()


def run_trtllm(case: Case, backend: str = "reference") -> Trace:
    """TRT-LLM's PyTorch-backend adapter, ``ReplayMambaStates`` over a ``temporal`` laid out as
    TRT-LLM's (GDN / KDA ``[slots, HV, V, K]``): sequence i in slot i, padded rows as TRT-LLM's
    shared padding slot, the prefill write + ``refresh``, ``decode`` / ``verify`` as the
    layers' call sites make them, the commit as ``update_mamba_states`` and ``flush``. No fork:
    TRT-LLM copies no slots between requests."""
    from replayssm.integrations.trtllm.cache import ReplayMambaStates
    spec, cfg, pad = case.spec, case.cfg, case.num_seqs
    shape = spec.state_shape[:-2] + spec.state_shape[-2:][::-1] if spec.is_delta else spec.state_shape
    temporal = torch.zeros(NUM_LAYERS, case.num_seqs + 1, *shape, dtype=cfg.torch_checkpoint_dtype)
    states = ReplayMambaStates(spec, cfg, temporal, state_layout="vk" if spec.is_delta else "kv",
                               backend=backend, padding_slots=(pad,))
    first = torch.arange(INIT_SEQS, dtype=torch.int32)
    temporal[0, :INIT_SEQS] = (case.init_state.transpose(-1, -2) if spec.is_delta else case.init_state).to(temporal.dtype)
    states.refresh(first, layer=0)
    trace = Trace([])
    for step in case.steps:
        slots = torch.tensor([r if r >= 0 else pad for r in step.rows], dtype=torch.int32)
        if step.kind == "fork":
            raise ValueError("case: TRT-LLM's adapter has no fork")
        if step.kind == "flush":
            states.flush(slots)
            continue
        fn = states.decode if step.kind == "decode" else states.verify
        trace.outputs.append(fn(0, slots, out=_out(case, step), **step.inputs))
        if step.kind == "verify":
            states.update_mamba_states(SimpleNamespace(num_contexts=0, num_seqs=len(step.rows)), step.accepted, slots)
    trace.state = _snapshot(states.pool, list(range(case.num_seqs)))
    return trace


_MODEL_DIMS = {
    "mamba2": lambda s: ("nemotron_h", dict(mamba_num_heads=s.num_heads, mamba_head_dim=s.head_dim,
                                            ssm_state_size=s.state_dim, n_groups=s.num_groups)),
    "gdn": lambda s: ("qwen3_next", dict(linear_num_key_heads=s.num_k_heads, linear_num_value_heads=s.num_v_heads,
                                         linear_key_head_dim=s.head_k_dim, linear_value_head_dim=s.head_v_dim)),
    "kda": lambda s: ("kimi_linear", dict(linear_num_heads=s.num_v_heads, linear_head_dim=s.head_k_dim)),
}


def transformers_model(case: Case):
    """transformers' own tiny model of the family with the case's recurrent-layer dims."""
    from replayssm.integrations.transformers.models import tiny_config
    import transformers
    name, dims = _MODEL_DIMS[case.family](case.spec)
    config = tiny_config(name)
    for k, v in dims.items():
        setattr(config, k, v)
    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return cls(config).eval()


def _transformers_call(case: Case, module, fn_name: str, handle, inp: dict, verify: bool):
    """The routed transformers function with the inputs of one sequence (batch 1) in its convention."""
    fn = getattr(module, fn_name)
    if case.family == "mamba2":
        P, N = case.spec.head_dim, case.spec.state_dim
        if verify:
            return fn(hidden_states=inp["x"], dt=inp["dt"], A=inp["A"], B=inp["B"], C=inp["C"], chunk_size=16,
                      D=inp["D"], dt_bias=inp["dt_bias"], initial_states=handle, dt_softplus=True)
        return fn(handle, inp["x"], inp["dt"][..., None].expand(-1, -1, P), inp["A"][:, None, None].expand(-1, P, N),
                  inp["B"], inp["C"], D=inp["D"][:, None].expand(-1, P), dt_bias=inp["dt_bias"][:, None].expand(-1, P),
                  dt_softplus=True, z=inp["z"])
    group = case.spec.num_v_heads // case.spec.num_k_heads
    tok = (lambda t: t) if verify else (lambda t: t[:, None])  # noqa: E731
    # transformers' models hand the routed function q normalised (the vectors' q times its q_scale)
    normed = dict(inp, q=inp["q"].float() * inp["q_scale"][..., None])
    q, k = (tok(normed[n]).repeat_interleave(group, dim=2) for n in ("q", "k"))
    o, _ = fn(q, k, tok(inp["v"]), tok(inp["g"]), tok(inp["beta"]), initial_state=handle,
              output_final_state=False, use_qk_l2norm_in_kernel=False)
    return o if verify else o[:, 0]


def run_transformers(case: Case, backend: str = "reference") -> Trace:
    """``ReplayCache`` over transformers' own model of the family, one cache (batch 1) per sequence
    (its commit keeps one count for the whole batch): the initial state through
    ``update_recurrent_state`` (the prefill's hand-over) in every recurrent layer, steps through the
    modeling module's routed step / chunk functions (the same inputs in every layer; the trace
    keeps the last layer's outputs and pool layer 0's state), ``cache.commit`` after a verify.
    Decode and verify scripts only; padded rows have no counterpart (their outputs stay NaN) and
    Mamba-2's chunk function takes no gate ``z`` (the model gates afterwards), so its verify
    outputs are ungated."""
    import importlib

    from replayssm.integrations.transformers.cache import ReplayCache
    model = transformers_model(case)
    trace = Trace([_out(case, s) for s in case.steps])
    per_seq = []
    for seq in range(INIT_SEQS):
        cache = ReplayCache(model, case.cfg, batch_size=1, backend=backend)
        family = cache.family
        module = importlib.import_module(family.module)
        # every recurrent layer of the model takes the same inputs (the commit moves all of them)
        handles = [cache.update_recurrent_state(case.init_state[seq:seq + 1].clone(), idx) for idx in cache.layer_map]
        # the other layers hold a prefill's keys in a real run (commit crops them): 16 zero tokens
        for idx in range(len(cache.layers)):
            if idx not in cache.layer_map and hasattr(cache.layers[idx], "update"):
                cache.update(torch.zeros(1, 1, 16, 1), torch.zeros(1, 1, 16, 1), idx)
        with cache.routing():
            for j, step in enumerate(case.steps):
                i = step.rows.index(seq)
                inp = {k: (v[i:i + 1] if isinstance(v, torch.Tensor) and v.dim() > 1 else v)
                       for k, v in step.inputs.items()}
                verify = step.kind == "verify"
                for handle in handles:
                    y = _transformers_call(case, module, family.chunk if verify else family.step, handle, inp, verify)
                trace.outputs[j][i] = y[0].to(trace.outputs[j].dtype)
                if verify:
                    cache.commit(int(step.accepted[i]))
        per_seq.append(_snapshot(cache.pool, cache.slots.tolist()))
    trace.state = {k: torch.cat([s[k] for s in per_seq]) for k in per_seq[0]}
    return trace
