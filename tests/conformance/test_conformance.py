"""Cross-framework conformance: the same vectors (``vectors.py``) through every path that runs on a CPU.

Every path's outputs are checked against the fp64 step recurrence within ``helpers.TOL``
(padded rows exactly zero; output buffers the suite hands in start NaN-poisoned). Against the
reference pool, raw ring entries and cursors are bit-exact on every path (the delta families' d
cache within the pair tolerance of two implementations). SGLang's pool over a backend is
bit-exact with the standalone pool of that backend in outputs, rings, cursors, checkpoint and
read-copy bytes wherever the same arithmetic runs in the same order (``layout_exact``). The
TensorRT-LLM AOT plans (``plan_for``) must launch the same kernels with the same constexprs,
warps, grid and arguments as the torch ops did. The TensorRT PTX path (``paths.run_trt_ptx``) runs
here with the torch ops in place of the driver launch, every launch's parameters packed in
TensorRT's order from the pool's buffers and checked against the plugin descriptors
(``trt-ptx-dry``); the PTX itself runs in ``benchmarks/gpu_conformance.py``. The last test prints
the matrix path x family x mode.
"""

from __future__ import annotations

import functools

import pytest
import torch

import replayssm as rs
from checks import check_identical, check_kernels_vs_reference, check_outputs, check_state, pair_tolerance
from helpers import rms_ratio
from paths import run_oracle, run_pool, run_sglang, run_transformers, run_trt_ptx, run_trtllm, trt_ptx_uncovered
from vectors import CASES, FAMILIES, MODES, make_case

pytest.importorskip("sglang")

RESULTS: dict = {}   # (path, family, mode) -> (passed, max error vs the recurrence or None, checks failed)
TRANSFORMERS_MODES = ("decode", "verify", "fp8-fp16sr", "nvfp4-bf16")   # no fork / flush / padding in a DynamicCache
SGLANG_TRITON_MODES = ("decode", "verify", "flush", "fp8-fp16sr", "nvfp4-bf16")
TRTLLM_MODES = tuple(m for m in MODES if m != "fork")                   # TRT-LLM copies no slots


@functools.cache
def case(family, mode):
    return make_case(family, mode)


@functools.cache
def oracle(family, mode):
    return run_oracle(case(family, mode))


@functools.cache
def trace(path, family, mode):
    c = case(family, mode)
    if path in ("reference", "triton"):
        return run_pool(c, path)
    if path.startswith("sglang-"):
        return run_sglang(c, path.removeprefix("sglang-"))
    if path == "trtllm-adapter":
        return run_trtllm(c)
    return run_transformers(c)


def record(path, c, worst, problems):
    RESULTS[path, c.family, c.mode] = (not problems, worst, problems)
    assert not problems, f"{path} {c.name}: {problems}"


@pytest.mark.parametrize("family", FAMILIES)
def test_vectors_are_deterministic_and_hit_the_boundaries(family):
    """Two draws of a case are equal; "decode" flushes at count + 1 == window (epoch 2 after the
    host write, count 1 after 5 tokens) and "flush" at two verifies with count + T == window and
    at ``pool.flush`` (epoch 4, count = the last verify's accepted tokens)."""
    for mode in MODES:
        a, b = make_case(family, mode), make_case(family, mode)
        assert torch.equal(a.init_state, b.init_state) and len(a.steps) == len(b.steps)
        for sa, sb in zip(a.steps, b.steps):
            assert sa.rows == sb.rows and (sa.inputs or {}).keys() == (sb.inputs or {}).keys()
            for k, v in (sa.inputs or {}).items():
                assert not isinstance(v, torch.Tensor) or torch.equal(v, sb.inputs[k]), (mode, k)
    state = trace("reference", family, "decode").state
    assert state["cursor.epoch"].eq(2).all() and state["cursor.count"].eq(1).all()
    state, last = trace("reference", family, "flush").state, case(family, "flush").steps[-1]
    kept = last.accepted[torch.tensor([r >= 0 for r in last.rows])]
    assert state["cursor.epoch"].eq(4).all() and torch.equal(state["cursor.count"], kept.int())


@pytest.mark.parametrize("family,mode", CASES)
def test_reference_pool(family, mode):
    c, problems = case(family, mode), []
    t = trace("reference", family, mode)
    record("reference", c, check_outputs(c, t.outputs, oracle(family, mode), problems), problems)


@pytest.mark.parametrize("family,mode", CASES)
def test_triton_pool(family, mode):
    """Triton kernels (interpreter): recurrence tolerance, raw rings and cursors bit-exact vs the reference."""
    c, problems = case(family, mode), []
    t = trace("triton", family, mode)
    worst = check_outputs(c, t.outputs, oracle(family, mode), problems)
    check_kernels_vs_reference(c, t, trace("reference", family, mode), problems)
    record("triton", c, worst, problems)


SGLANG = [("reference", f, m) for f, m in CASES] + [("triton", f, m) for f, m in CASES if m in SGLANG_TRITON_MODES]


def layout_exact(c, backend: str) -> bool:
    """Whether SGLang's pool reproduces the standalone pool's bits. SGLang keeps GDN / KDA state as
    ``[HV, V, K]`` (a transposed checkpoint view); the Triton kernels take any strides, but PyTorch
    math over that view (the reference backend's steps, ``pool.flush``'s fold) rounds in another
    order: the last fp32 bits of d, outputs and checkpoint may differ there (measured <= 1.2e-7).
    Behind a read copy the Triton flush pass has tiles of its own on ``[HV, V, K]`` (``key_runs``:
    a reduction over K summed run by run), so a flush row's d and outputs round in another order too."""
    return not (c.spec.is_delta and (backend == "reference" or any(s.kind == "flush" for s in c.steps)
                                     or c.cfg.read_format != "checkpoint"))


def check_against_pool(c, t, backend: str, problems: list) -> None:
    """An adapter's trace vs the standalone pool of ``backend``: outputs, d, checkpoint and
    read-copy bytes bit-exact where ``layout_exact``, else within the pair tolerance (the
    checkpoint to 1e-6); raw rings and cursors bit-exact either way."""
    base = trace(backend, c.family, c.mode)
    exact = layout_exact(c, backend)
    for j, (y, y_ref) in enumerate(zip(t.outputs, base.outputs)):
        if not (torch.equal(y, y_ref) if exact else rms_ratio(y, y_ref) < pair_tolerance(c.cfg)):
            problems.append(f"step {j} outputs differ from the {backend} pool")
    check_state(c, t.state, base.state, problems, exact=exact)
    if not exact and rms_ratio(t.state["checkpoint"].float(), base.state["checkpoint"].float()) >= 1e-6:
        problems.append(f"checkpoint vs the {backend} pool")


@pytest.mark.parametrize("backend,family,mode", SGLANG)
def test_sglang_plugin(backend, family, mode):
    """SGLang's pool objects and call sites over a backend vs the standalone pool of that backend:
    raw rings and cursors bit-exact; outputs, d, checkpoint and read-copy bytes bit-exact where
    ``layout_exact``, else within the pair tolerance; fork too (SGLang's ``copy_from`` carries the
    ring, as ``pool.fork`` does)."""
    c, problems = case(family, mode), []
    t = trace(f"sglang-{backend}", family, mode)
    worst = check_outputs(c, t.outputs, oracle(family, mode), problems)
    check_against_pool(c, t, backend, problems)
    record(f"sglang-{backend}", c, worst, problems)


@pytest.mark.parametrize("family,mode", [(f, m) for f, m in CASES if m in TRTLLM_MODES])
def test_trtllm_adapter(family, mode):
    """TRT-LLM's adapter (``ReplayMambaStates``, reference backend) over a TRT-LLM-shaped state tensor
    vs the reference pool: raw rings and cursors bit-exact; outputs, d, checkpoint and read-copy
    bytes bit-exact where ``layout_exact`` (Mamba-2), else within the pair tolerance (the delta
    state is ``[HV, V, K]`` there, as TRT-LLM's GDN keeps it)."""
    c, problems = case(family, mode), []
    t = trace("trtllm-adapter", family, mode)
    worst = check_outputs(c, t.outputs, oracle(family, mode), problems)
    check_against_pool(c, t, "reference", problems)
    record("trtllm-adapter", c, worst, problems)


@pytest.mark.parametrize("family,mode", [(f, m) for f, m in CASES if m in TRANSFORMERS_MODES])
def test_transformers_cache(family, mode):
    """ReplayCache (reference backend) through transformers' routed functions, one sequence per
    cache, vs the reference pool (a batch of three rows): raw rings and cursors bit-exact; outputs,
    d and checkpoint within the pair tolerance (the reference's PyTorch steps round their last fp32
    bits differently at batch 1, measured <= 2.4e-7). Mamba-2 verify outputs (transformers' chunk
    function takes no gate z) against the ungated recurrence only."""
    c, problems = case(family, mode), []
    t = trace("transformers", family, mode)
    worst = check_outputs(c, t.outputs, oracle(family, mode), problems, ungated_verify=True, padded=False)
    base = trace("reference", family, mode)
    steps = [s for s in c.steps if s.kind in ("decode", "verify")]
    for j, (step, y, y_ref) in enumerate(zip(steps, t.outputs, base.outputs)):
        if family == "mamba2" and step.kind == "verify":
            continue
        real = torch.tensor([r >= 0 for r in step.rows])
        if rms_ratio(y[real], y_ref[real]) >= pair_tolerance(c.cfg):
            problems.append(f"step {j} outputs differ from the reference pool")
    check_state(c, t.state, base.state, problems, exact=False)
    if rms_ratio(t.state["checkpoint"].float(), base.state["checkpoint"].float()) >= pair_tolerance(c.cfg):
        problems.append("checkpoint vs the reference pool")
    record("transformers", c, worst, problems)


def _signature(lc) -> dict:
    """name -> Triton type of a launch's runtime arguments, in kernel order."""
    from replayssm.integrations.trtllm.steps import launch_signature as sig
    return sig(lc.kernel, lc.args, lc.constexprs)


def _arguments(lc) -> list:
    """A launch's runtime arguments in order: tensors by their shape past the slot / row axis,
    integers and floats by value (``sr_base``, the seed's hash, excepted: the AOT build passes a
    placeholder; ``num_slots`` too, the pool's slots, a size TensorRT passes as the slot axis is)."""
    names = [a for a in lc.kernel.arg_names if a not in lc.constexprs]
    return [tuple(v.shape[1:]) if isinstance(v, torch.Tensor) else {"sr_base": None, "num_slots": "S"}.get(k, v)
            for k, v in zip(names, lc.args)]


def _num_slots(lc) -> tuple[int, int]:
    """A step launch's ``num_slots`` argument and its checkpoint's slots."""
    names = [a for a in lc.kernel.arg_names if a not in lc.constexprs]
    return dict(zip(names, lc.args))["num_slots"], lc.args[0].shape[0]


@pytest.mark.parametrize("family,mode", CASES)
def test_trtllm_aot_plan(family, mode, monkeypatch):
    """``steps.plan_for`` for the case's dims and config equals every launch the torch ops ran:
    kernel, constexprs, warps, grid, flush pass, arguments in order (names, tensor shapes past the
    slot axis, scalar values such as strides, window and capacity); pointer element types
    too where the case uses the AOT build's bf16 ring. Loading
    the PTX through the driver needs a GPU and is not run here."""
    from replayssm.integrations.trtllm import steps as trtllm_steps
    c, problems = case(family, mode), []
    dims = dict(family=family, **{k: v for k, v in vars(c.spec).items() if k != "family" and v})
    monkeypatch.setitem(trtllm_steps.MODELS, "conformance", dims)
    launches = [lc for lc in trace("triton", family, mode).launches      # T = 0: StatePool.flush, not a step
                if lc.op.endswith("_step") and lc.constexprs["T"] > 0]
    steps = [s for s in c.steps if s.kind in ("decode", "verify")]
    typed, compared, first = c.cfg.ring_dtype == "bfloat16", 0, 0
    for j, step in enumerate(steps):
        _, plan = trtllm_steps.plan_for("conformance", step.tokens or 1, c.cfg.read_format, c.cfg.checkpoint_dtype,
                                      c.cfg.window, n=len(step.rows), max_draft_tokens=c.cfg.max_draft_tokens)
        ran_here, first = launches[first:first + len(plan)], first + len(plan)   # 1 (a decode on the checkpoint) or 2
        if len(ran_here) != len(plan):
            problems.append(f"step {j}: {len(ran_here)} launches ran, {len(plan)} planned")
        for ran, planned in zip(ran_here, plan):
            for attr in ("op", "kernel", "constexprs", "num_warps", "grid", "flush_pass"):
                if getattr(ran, attr) != getattr(planned, attr):
                    problems.append(f"step {j}: {attr} {getattr(ran, attr)} != {getattr(planned, attr)}")
            a, b = _signature(ran), _signature(planned)
            if list(a) != list(b):
                problems.append(f"step {j}: argument names {list(a)} != {list(b)}")
            if _arguments(ran) != _arguments(planned):
                problems.append(f"step {j}: arguments differ in shape or value")
            for lc in (ran, planned):
                if _num_slots(lc)[0] != _num_slots(lc)[1]:
                    problems.append(f"step {j}: num_slots {_num_slots(lc)} is not the checkpoint's slots")
            compared += 1
            kinds = {k: (a[k], b[k]) for k in a if k in b and a[k] != b[k]
                     and not (a[k].startswith("*") and b[k].startswith("*"))}
            typo = {k: (a[k], b[k]) for k in a if k in b and a[k] != b[k]} if typed else {}
            if kinds or typo:
                problems.append(f"step {j}: argument types {kinds or typo}")
    if first != len(launches):
        problems.append(f"{len(launches)} launches ran, {first} planned for {len(steps)} steps")
    if not compared:
        problems.append("no launch compared")
    record("trtllm-plan", c, None, problems)


def test_trtllm_aot_decode_plan_for_a_drafting_pool():
    """Qwen3.5 GDN, window 16, drafts of up to 3 tokens (T_max 4): the pool's ring holds
    max(15, 4) + 4 = 19 entries; the AOT decode plan for that pool must launch on that ring (a plan
    sized for T = 1 alone would index a ring of 16) with the pool's history block. A small window
    with many drafts (window 4, 16 drafts: T_max 17, history up to 17) needs a block of 32 where
    the decode-only ring needs 16."""
    from replayssm.integrations.trtllm import steps
    from replayssm.kernels import ops
    pool_cfg = rs.ReplayConfig(window=16, max_draft_tokens=3)
    _, plan = steps.plan_for("qwen3.5", 1, "checkpoint", "float32", 16, max_draft_tokens=3)
    assert plan[0].args[-2] == pool_cfg.capacity == 19                     # the capacity argument
    assert plan[0].constexprs["BM"] == ops._history_block(pool_cfg.capacity, 16, 1) == 16
    _, small = steps.plan_for("qwen3.5", 1, "checkpoint", "float32", 4, max_draft_tokens=16)
    _, alone = steps.plan_for("qwen3.5", 1, "checkpoint", "float32", 4)
    assert small[0].constexprs["BM"] == 32 and alone[0].constexprs["BM"] == 16
    with pytest.raises(ValueError, match="max_draft_tokens"):
        steps.plan_for("qwen3.5", 4, "checkpoint", "float32", 16, max_draft_tokens=2)


def _packed_ops_step(spec, cfg, op: str, tokens: int, has_z: bool):
    """``run_trt_ptx``'s launcher without a GPU: each plugin layer's parameters packed as
    ``ptx_launch.PtxStep`` packs them (shapes, dtypes, contiguity checked against the descriptors),
    the pointers and extra args compared with the arguments of the torch ops' launches of the step
    (scalars: those Triton's JIT does not compile in, as int32), which then run on the same buffers."""
    from replayssm.integrations.trtllm import ptx_launch, steps
    from replayssm.integrations.trtllm import plugin_desc as pd
    from replayssm.kernels import ops
    entries = [ptx_launch.layer_entry(d, name=d.kernel.kernel_name, shared=0)
               for d in pd.describe_step(spec, cfg, op=op, tokens=tokens, has_z=has_z)]

    def step(bufs):
        n, S = ptx_launch.step_sizes(bufs)
        plan = steps.step_plan(spec, cfg, bufs, committed=op == "decode")
        launched = [list(zip([a for a in lc.kernel.arg_names if a not in lc.constexprs], lc.args)) for lc in plan]
        launched.append([(k, bufs[k]) for k in ("count", "origin", "pending", "epoch", "slots")] +
                        list(zip(("n", "num_slots", "T", "window", "capacity"),
                                 (n, S, tokens, cfg.window, cfg.capacity))))
        for entry, args in zip(entries, launched, strict=True):
            values, _ = ptx_launch.pack_args(entry, bufs)
            kinds = [a["kind"] for a in entry["args"]]
            ptrs = [a.data_ptr() for _, a in args if isinstance(a, torch.Tensor)]
            scalars = [(p, a) for p, a in args if not isinstance(a, torch.Tensor)]
            assert [v for v, k in zip(values, kinds) if k != "extra"][:len(ptrs)] == ptrs, entry["plugin_id"]
            assert [v for v, k in zip(values, kinds) if k == "extra"] == \
                [pd._int32(p, a) for p, a in scalars if not pd._jit_constant(a) or p in ("n", "num_slots")], \
                entry["plugin_id"]
        ops.launch(plan)
        ops.advance(bufs["count"], bufs["origin"], bufs["pending"], bufs["epoch"], bufs["slots"], tokens, cfg.window,
                    cfg.capacity, op == "decode")
    return step


@pytest.mark.parametrize("family,mode", CASES)
def test_trt_ptx_host_side(family, mode):
    """The TensorRT PTX path's host side (``run_trt_ptx``: pool buffers as the plugin layers'
    parameters, commit / fork / flush through the pool) with the torch ops launched in place of the
    PTX: recurrence tolerance, and bit-exact with the Triton pool in outputs, rings, cursors,
    checkpoint and read-copy bytes."""
    c, problems = case(family, mode), []
    assert trt_ptx_uncovered(c) is None
    t = run_trt_ptx(c, device="cpu", launcher=_packed_ops_step)
    worst = check_outputs(c, t.outputs, oracle(family, mode), problems)
    check_identical(c, t, trace("triton", family, mode), problems)
    record("trt-ptx-dry", c, worst, problems)


def test_matrix(capsys):
    """Print path x family x mode (pass / FAIL, worst error vs the fp64 recurrence); every cell ran and passed."""
    paths = ("reference", "triton", "sglang-reference", "sglang-triton", "transformers", "trtllm-adapter",
             "trtllm-plan", "trt-ptx-dry")
    lines = [f"{'path':<17}{'family':<8}" + "".join(f"{m:>13}" for m in MODES)]
    for path in paths:
        for family in FAMILIES:
            cells = []
            for mode in MODES:
                r = RESULTS.get((path, family, mode))
                if r is None:
                    cells.append("-")
                else:
                    cells.append(("pass" if r[0] else "FAIL") + ("" if r[1] is None else f" {r[1]:.0e}"))
            lines.append(f"{path:<17}{family:<8}" + "".join(f"{x:>13}" for x in cells))
    with capsys.disabled():
        print("\nconformance matrix (pass/FAIL, max RMS ratio vs the fp64 step recurrence; - = path not run)")
        print("\n".join(lines))
    expected = (4 * len(CASES) + len(SGLANG) + sum(m in TRANSFORMERS_MODES for _, m in CASES)
                + sum(m in TRTLLM_MODES for _, m in CASES))
    assert len(RESULTS) == expected, "run the whole conformance module for the matrix"
    assert all(r[0] for r in RESULTS.values())
