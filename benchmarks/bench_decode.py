"""Decode-step benchmark: replayssm kernels vs peers and bandwidth floors, in one run on one GPU.

    python benchmarks/bench_decode.py [--peers DIR] [--batches 1,64,256,512] [--json OUT.json]

For each model shape and batch: a correctness gate (our replay step from a fresh checkpoint
equals the conventional peer step on the same state), then CUDA-graph timings (median,
triton.testing.do_bench, which clears L2 between runs):
  ours: non-flush step at ring fill w = 0, 7, 14; flush step (w = 15); a whole window of
  16 decode steps with cursor moves (amortized); a staggered step (row r holds r mod 16 entries,
  so 1/16 of the rows flush: a serving steady state); non-flush (w = 7) / flush / staggered /
  amortized with fp8 and nvfp4 read copies; for GDN / KDA the same four steps for every read format
  (checkpoint, fp8, nvfp4) again on a [S, HV, V, K] checkpoint ("vk state", the layout the SGLang and
  TRT-LLM adapters bind), printed at the end side by side with SGLang's replay kernel from the same
  run (amortized, per model and batch; the JSON's "summary"); verify of T = 2, 4, 8 tokens without
  flush rows, and of T = 8 with half the rows flushing (row r holds r mod 16 entries).
  peers (loaded from --peers when present): mamba_ssm selective_state_update, fla
  fused_recurrent_gated_delta_rule (T = 1, 2, 4, 8), fla fused_recurrent_kda_fwd (T = 1 and
  per-draft snapshots), SGLang 0.5.23 fused_recurrent_linear_replayssm_decode (GDN and KDA;
  at w = 0, 7, 14, flush and staggered).
  floors: device copy, read-only pass and in-place read+write pass over the same state bytes.
GB/s counts the bytes a step must move (state or read copy, ring entries read and appended,
activations); see ``bytes_*`` below. The JSON names the date, the GPU, torch, Triton and the commit
(``REPLAYSSM_COMMIT`` in the environment, else ``unknown``).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import time
import types

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
import replayssm as rs  # noqa: E402
from floors import read_floor, rw_floor  # noqa: E402
from replayssm.kernels import ops  # noqa: E402
from replayssm.kernels.formats.triton import CKPT_CODES, READ_CODES  # noqa: E402
from report import by_model_batch, sglang_amortized  # noqa: E402
from shapes import BATCHES, MODEL_SPECS, WINDOW  # noqa: E402
from snapshot_mamba2 import snapshot_verify  # noqa: E402

DEV = "cuda"
ACT = torch.bfloat16
RESULTS: list[dict] = []
SUMMARY: list[dict] = []  # GDN / KDA amortized steps by layout and read format, per model and batch
JSONL: str | None = None  # rows are appended here as they are measured


def timed(fn, graph: bool = True) -> float:
    """Median microseconds of ``fn`` replayed from a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    return do_bench(run, warmup=25, rep=200, return_mode="median") * 1e3


def record(model, batch, what, us, nbytes, **extra):
    row = dict(model=model, batch=batch, what=what, us=round(us, 2), gbps=round(nbytes / us / 1e3, 1), **extra)
    RESULTS.append(row)
    if JSONL:
        with open(JSONL, "a") as f:
            f.write(json.dumps(row) + "\n")
    print(f"{model:13s} b={batch:<4d} {what:34s} {us:9.1f} us {row['gbps']:8.1f} GB/s", flush=True)


def peer_sources(peers: dict) -> dict:
    """Where each loaded peer came from: its source file, and fla's version (``fla.__version__``), so a
    run's JSON says which peers it timed."""
    out = {}
    for name, fn in peers.items():
        out[name] = dict(file=inspect.getfile(fn))
        if name.startswith("fla_"):
            out[name]["version"] = getattr(sys.modules.get("fla"), "__version__", None)
    return out


def load_peers(root: str | None) -> dict:
    peers = {}
    if not root or not os.path.isdir(root):
        return peers
    sys.path.insert(0, root)
    try:
        # mamba_ssm's Triton file imports mamba_ssm.ops.triton.softplus; give it that one function
        @triton.jit
        def softplus(dt):
            return tl.log(tl.exp(dt) + 1)
        for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
            sys.modules.setdefault(name, types.ModuleType(name))
        sp = types.ModuleType("mamba_ssm.ops.triton.softplus")
        sp.softplus = softplus
        sys.modules["mamba_ssm.ops.triton.softplus"] = sp
        spec = importlib.util.spec_from_file_location("peer_ssu", os.path.join(root, "selective_state_update.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        peers["mamba_ssm"] = mod.selective_state_update
    except Exception as e:  # a missing peer is reported, not fatal
        print("peer mamba_ssm unavailable:", repr(e))
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
        peers["fla_gdn"] = fused_recurrent_gated_delta_rule
        peers["fla_kda"] = fused_recurrent_kda_fwd
    except Exception as e:
        print("peer fla unavailable:", repr(e))
    try:
        spec = importlib.util.spec_from_file_location(
            "peer_sglang", os.path.join(root, "fused_recurrent_linear_replayssm.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        peers["sglang"] = mod.fused_recurrent_linear_replayssm_decode
    except Exception as e:
        print("peer sglang unavailable:", repr(e))
    return peers


class Layer:
    """A one-layer pool at model dims with random state and bf16 inputs; steps call the ops directly."""

    def __init__(self, spec, batch, read_format="checkpoint", max_draft_tokens=0, seed=0, state_layout="kv",
                 checkpoint_dtype="float32"):
        self.spec, self.batch = spec, batch
        self.cfg = rs.ReplayConfig(window=WINDOW, max_draft_tokens=max_draft_tokens, read_format=read_format,
                                   ring_dtype="bfloat16", checkpoint_dtype=checkpoint_dtype)
        owned = None
        if state_layout == "vk":   # a framework's [slots, HV, V, K] state (SGLang's, TRT-LLM's GDN)
            owned = torch.zeros(1, batch, *spec.state_shape[:-2], *spec.state_shape[-2:][::-1], device=DEV,
                                dtype=self.cfg.torch_checkpoint_dtype)
        self.pool = rs.StatePool(spec, self.cfg, num_layers=1, num_slots=batch, device=DEV, backend="triton",
                                 checkpoint=owned, state_layout=state_layout)
        self.slots = self.pool.alloc(batch)
        gen = torch.Generator(device=DEV).manual_seed(seed)
        self.gen = gen
        state = torch.randn(batch, *spec.state_shape, device=DEV, generator=gen) * 0.1
        self.pool.write_state(0, self.slots, state)
        for buf in self.pool.ring.values():  # history entries as a real ring would hold
            buf.copy_((torch.randn(buf.shape, device=DEV, generator=gen) * 0.1).to(buf.dtype))
        if spec.family != "mamba2":
            self.pool.ring["g"].copy_(-torch.rand(self.pool.ring["g"].shape, device=DEV, generator=gen) * 0.1)
            self.pool.ring["beta"].copy_(torch.rand(self.pool.ring["beta"].shape, device=DEV, generator=gen))
        self.state0 = state

    def inputs(self, T):
        s, n, g = self.spec, self.batch, self.gen
        r = lambda *shape, scale=1.0: (torch.randn(*shape, device=DEV, generator=g) * scale).to(ACT)  # noqa: E731
        if s.family == "mamba2":
            H, P, N, G = s.num_heads, s.head_dim, s.state_dim, s.num_groups
            return dict(x=r(n, T, H, P), dt=torch.randn(n, T, H, device=DEV, generator=g) - 1,
                        A=-torch.rand(H, device=DEV, generator=g) - 0.5, B=r(n, T, G, N, scale=0.3),
                        C=r(n, T, G, N, scale=0.3), D=torch.ones(H, device=DEV), dt_bias=torch.zeros(H, device=DEV),
                        z=r(n, T, H, P))
        HK, HV, K, V = s.num_k_heads, s.num_v_heads, s.head_k_dim, s.head_v_dim
        k = torch.nn.functional.normalize(torch.randn(n, T, HK, K, device=DEV, generator=g), dim=-1).to(ACT)
        gshape = (n, T, HV) if s.family == "gdn" else (n, T, HV, K)
        return dict(q=r(n, T, HK, K), k=k, v=r(n, T, HV, V), g=-torch.rand(gshape, device=DEV, generator=g) * 0.1,
                    beta=torch.rand(n, T, HV, device=DEV, generator=g))

    def set_fill(self, w):
        self.pool.cursors["count"][0, : self.batch] = w
        self.pool.cursors["origin"][0, : self.batch] = 0
        self.pool.cursors["pending"].zero_()

    def set_staggered(self):
        """Row r holds r mod L history entries: a serving steady state, where a step flushes 1/L of
        the rows and the others hold 0 .. L - 2 entries."""
        self.pool.cursors["count"][0, : self.batch] = torch.arange(self.batch, device=DEV) % WINDOW
        self.pool.cursors["origin"][0, : self.batch] = 0
        self.pool.cursors["pending"].zero_()

    def window_fn(self, steps):
        """``steps`` consecutive committed decodes (cursors advanced) from an empty ring, as one call."""
        fns = [self.step_fn(self.inputs(1), advance=True)[0] for _ in range(steps)]
        self.set_fill(0)

        def run():
            for f in fns:
                f()
        return run

    def step_fn(self, inp, committed=True, advance=False):
        pool, cfg, spec = self.pool, self.cfg, self.spec
        read = [pool.read[k][0] if pool.read else None for k in ("codes", "block_scale", "row_scale")]
        cur = pool.cursors
        T = (inp["x"] if spec.family == "mamba2" else inp["v"]).shape[1]
        heads, dim = (spec.num_heads, spec.head_dim) if spec.family == "mamba2" else (spec.num_v_heads, spec.head_v_dim)
        out = torch.empty(self.batch, T, heads, dim, dtype=ACT, device=DEV)
        fmt = dict(checkpoint_format=CKPT_CODES[cfg.checkpoint_dtype], read_format=READ_CODES[cfg.read_format],
                   sr_base=ops.sr_base(cfg.seed, 0))
        ring = {k: v[0] for k, v in pool.ring.items()}

        def fn():
            if spec.family == "mamba2":
                ops.mamba2_step(pool.checkpoint[0], *read, ring["x"], ring["dt"], ring["B"], cur["count"][0],
                                cur["origin"][0], cur["epoch"][0], self.slots, inp["x"], inp["dt"], inp["A"], inp["B"],
                                inp["C"], inp["D"], inp["dt_bias"], inp["z"], out, cfg.window, committed, **fmt)
            else:
                ops.delta_step(pool.checkpoint[0], *read, ring["k"], ring["v"], ring["g"], ring["beta"], ring["d"],
                               cur["count"][0], cur["origin"][0], cur["epoch"][0], self.slots, inp["q"], inp["k"],
                               inp["v"], inp["g"], inp["beta"], out, spec.head_k_dim ** -0.5, cfg.window, committed,
                               **fmt, q_scale=inp.get("q_scale"))
            if advance:
                ops.advance(cur["count"][0], cur["origin"][0], cur["pending"][0], cur["epoch"][0], self.slots, T,
                            cfg.window, cfg.capacity, committed)
        return fn, out


def bytes_state(spec, fmt="float32"):
    heads, rows, cols = spec.read_rows_cols
    from replayssm.formats import bytes_per_element
    return spec.state_numel * bytes_per_element(fmt, cols)


def bytes_ring_entry(spec):
    if spec.family == "mamba2":
        return spec.num_heads * spec.head_dim * 2 + spec.num_heads * 4 + spec.num_groups * spec.state_dim * 2
    g = spec.num_v_heads * (spec.head_k_dim if spec.family == "kda" else 1) * 4
    d = spec.num_v_heads * spec.head_v_dim * 4            # the fp32 d cache
    return (spec.num_k_heads * spec.head_k_dim * 2 + spec.num_v_heads * spec.head_v_dim * 2 + g
            + spec.num_v_heads * 4 + d)


def bytes_io(spec, T=1):
    if spec.family == "mamba2":
        return T * (3 * spec.num_heads * spec.head_dim * 2 + 2 * spec.num_groups * spec.state_dim * 2
                    + spec.num_heads * 4)
    g = spec.num_v_heads * (spec.head_k_dim if spec.family == "kda" else 1) * 4
    return T * (2 * spec.num_k_heads * spec.head_k_dim * 2 + 2 * spec.num_v_heads * spec.head_v_dim * 2 + g
                + spec.num_v_heads * 4)


def check_against_peer(name, spec, layer, peers):
    """Our replay step from an empty ring must equal the conventional peer step on the same state."""
    inp = layer.inputs(1)
    layer.set_fill(0)
    fn, out = layer.step_fn(inp)
    st = layer.state0.clone()
    fn()
    if spec.family == "mamba2" and "mamba_ssm" in peers:
        H, P, N = spec.num_heads, spec.head_dim, spec.state_dim
        A = inp["A"][:, None, None].expand(H, P, N)
        dt = inp["dt"][:, 0, :, None].expand(-1, H, P)
        dtb = inp["dt_bias"][:, None].expand(H, P)
        Dd = inp["D"][:, None].expand(H, P)
        y = peers["mamba_ssm"](st, inp["x"][:, 0], dt, A, inp["B"][:, 0], inp["C"][:, 0], D=Dd, z=inp["z"][:, 0],
                               dt_bias=dtb, dt_softplus=True)
    elif spec.family == "gdn" and "fla_gdn" in peers:
        y, _ = peers["fla_gdn"](inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"],
                                scale=spec.head_k_dim ** -0.5, initial_state=st, output_final_state=True)
        y = y[:, 0]
    elif spec.family == "kda" and "fla_kda" in peers:
        y, _ = peers["fla_kda"](inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], initial_state=st,
                                scale=spec.head_k_dim ** -0.5, inplace_final_state=True)
        y = y[:, 0]
    else:
        return None
    err = ((out[:, 0].float() - y.float()).norm() / y.float().norm()).item()
    print(f"{name:13s} correctness vs peer conventional step: rel err {err:.2e}", flush=True)
    if not err < 2e-2:
        raise SystemExit(f"{name}: replay step disagrees with the peer ({err:.2e}); not timing")
    return err


def bench_model(name, spec, batch, peers, verify_batch):
    S = bytes_state(spec)
    ring = bytes_ring_entry(spec)
    io = bytes_io(spec)
    L = WINDOW
    layer = Layer(spec, batch)
    err = check_against_peer(name, spec, layer, peers) if batch == verify_batch else None
    inp = layer.inputs(1)
    fn, _ = layer.step_fn(inp)
    nonflush = {}
    for w in (0, 7, 14):
        layer.set_fill(w)
        nonflush[w] = timed(fn)
        record(name, batch, f"ours non-flush w={w}", nonflush[w], batch * (S + w * ring + ring + io))
    layer.set_fill(L - 1)
    flush = timed(fn)
    record(name, batch, "ours flush", flush, batch * (2 * S + L * ring + io))
    window_bytes = batch * (S + (2 * S) / L + (L - 1) / 2 * ring + ring + io)
    amort = timed(layer.window_fn(L)) / L
    record(name, batch, "ours amortized (16-step window)", amort, window_bytes, correctness=err)
    layer.set_staggered()
    record(name, batch, "ours staggered step (1/16 of rows flush)", timed(fn), window_bytes)
    # the read copies, and for GDN / KDA every read format again on the [S, HV, V, K] checkpoint the SGLang and
    # TRT-LLM adapters bind: the non-flush (w = 7), flush, staggered and amortized steps of each
    amortized = {("kv", "checkpoint"): amort}
    for layout in ("kv",) if spec.family == "mamba2" else ("kv", "vk"):
        for rf in ("checkpoint", "fp8", "nvfp4"):
            if (layout, rf) != ("kv", "checkpoint"):
                amortized[layout, rf] = bench_layout(name, spec, batch, layout, rf)
    if spec.family != "mamba2":
        SUMMARY.append(dict(model=name, batch=batch, amortized_us={f"{lay} {rf}": round(us, 2)
                                                                  for (lay, rf), us in amortized.items()}))
    # floors over the same state bytes
    st = layer.state0
    record(name, batch, "floor read", timed(read_floor(st)), batch * S)
    record(name, batch, "floor read+write", timed(rw_floor(st)), 2 * batch * S)
    # peers
    if spec.family == "mamba2" and "mamba_ssm" in peers:
        H, P, N = spec.num_heads, spec.head_dim, spec.state_dim
        i1 = layer.inputs(1)
        A = i1["A"][:, None, None].expand(H, P, N)
        dt = i1["dt"][:, 0, :, None].expand(-1, H, P)
        f = lambda: peers["mamba_ssm"](st, i1["x"][:, 0], dt, A, i1["B"][:, 0], i1["C"][:, 0],  # noqa: E731
                                       D=i1["D"][:, None].expand(H, P), z=i1["z"][:, 0],
                                       dt_bias=i1["dt_bias"][:, None].expand(H, P), dt_softplus=True)
        record(name, batch, "peer mamba_ssm selective_state_update", timed(f), batch * (2 * S + io))
    if spec.family == "gdn" and "fla_gdn" in peers:
        i1 = layer.inputs(1)
        f = lambda: peers["fla_gdn"](i1["q"], i1["k"], i1["v"], g=i1["g"], beta=i1["beta"],  # noqa: E731
                                     scale=spec.head_k_dim ** -0.5, initial_state=st, output_final_state=True)
        record(name, batch, "peer fla fused_recurrent T=1", timed(f), batch * (2 * S + io))
    if spec.family == "kda" and "fla_kda" in peers:
        i1 = layer.inputs(1)
        f = lambda: peers["fla_kda"](i1["q"], i1["k"], i1["v"], i1["g"], i1["beta"], initial_state=st,  # noqa: E731
                                     scale=spec.head_k_dim ** -0.5, inplace_final_state=True)
        record(name, batch, "peer fla fused_recurrent_kda T=1", timed(f), batch * (2 * S + io))
    if spec.family != "mamba2" and "sglang" in peers:
        bench_sglang(name, spec, batch, peers["sglang"], st)
    del layer


def bench_layout(name, spec, batch, layout, rf):
    """Non-flush (w = 7), flush, staggered and amortized (a 16-step window) steps with read format
    ``rf`` on a ``layout`` checkpoint; returns the amortized microseconds."""
    S, ring, io, L = bytes_state(spec), bytes_ring_entry(spec), bytes_io(spec), WINDOW
    read = S if rf == "checkpoint" else bytes_state(spec, rf)
    copy = 0 if rf == "checkpoint" else read                  # a flush also writes the read copy
    vk = layout == "vk"
    fmt = "" if rf == "checkpoint" else f" {rf}"
    tag = f"{fmt} (vk state)" if vk else fmt
    extra = dict(layout=layout, read_format=rf)
    lq = Layer(spec, batch, read_format=rf, state_layout=layout)
    fq, _ = lq.step_fn(lq.inputs(1))
    lq.set_fill(7)
    record(name, batch, f"ours non-flush w=7{tag}", timed(fq), batch * (read + 8 * ring + io), **extra)
    lq.set_fill(L - 1)
    record(name, batch, f"ours flush{tag}", timed(fq), batch * (2 * S + copy + L * ring + io), **extra)
    window_bytes = batch * (read + (2 * S + copy) / L + (L - 1) / 2 * ring + ring + io)
    lq.set_staggered()
    record(name, batch, f"ours staggered step{tag}", timed(fq), window_bytes, **extra)
    amort = timed(lq.window_fn(L)) / L
    record(name, batch, f"ours amortized (16-step window{', vk state' if vk else ''}){fmt}", amort, window_bytes,
           **extra)
    del lq
    return amort


def print_summary():
    """GDN / KDA amortized steps side by side: each layout and read format, and SGLang's replay kernel
    over the same window on its [S, HV, V, K] state (``report.sglang_amortized``: 15 x the mean of
    w = 0, 7, 14, plus one flush, / 16, as BENCHMARKS.md's tables price it) from the same run."""
    if not SUMMARY:
        return
    cols = [f"{lay} {rf}" for lay in ("kv", "vk") for rf in ("checkpoint", "fp8", "nvfp4")]
    print("\namortized us per step (16-step window); sglang: (15 x mean(w=0, 7, 14) + flush) / 16")
    print(f"{'model':13s} {'batch':>5s} " + " ".join(f"{c:>14s}" for c in cols) + f" {'sglang replay':>14s}")
    by = by_model_batch(RESULTS)
    for row in SUMMARY:
        m, b = row["model"], row["batch"]
        sg = sglang_amortized(by[(m, b)])
        row["sglang_us"] = None if sg is None else round(sg, 2)
        cells = [row["amortized_us"].get(c) for c in cols] + [row["sglang_us"]]
        print(f"{m:13s} {b:>5d} " + " ".join(f"{'-':>14s}" if c is None else f"{c:>14.1f}" for c in cells))


def bench_sglang(name, spec, batch, kernel, st):
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    L = WINDOW
    kda = spec.family == "kda"
    g = torch.Generator(device=DEV).manual_seed(1)
    state = st.transpose(-1, -2).contiguous()                     # SGLang pool layout [slots, HV, V, K]
    d = (torch.randn(batch, HV, L, V, device=DEV, generator=g) * 0.1).to(ACT)
    kc = (torch.randn(batch, HK, L, K, device=DEV, generator=g) * 0.1).to(ACT)
    gc = -torch.rand((batch, HV, L, K) if kda else (batch, HV, L), device=DEV, generator=g) * 0.1
    qkv = (torch.randn(batch, 2 * HK * K + HV * V, device=DEV, generator=g)).to(ACT)
    a = torch.randn((batch, HV, K) if kda else (batch, HV), device=DEV, generator=g).to(ACT)
    b = torch.randn(batch, HV, device=DEV, generator=g).to(ACT)
    A_log = torch.zeros(HV, device=DEV)
    dt_bias = torch.zeros((HV, K) if kda else (HV,), device=DEV)
    out = torch.empty(batch, 1, HV, V, dtype=ACT, device=DEV)
    idx = torch.arange(batch, device=DEV, dtype=torch.int32)
    S = bytes_state(spec)
    ring = HK * K * 2 + HV * V * 2 + HV * (K if kda else 1) * 4     # k, d (bf16) and g (fp32) per entry
    for w in (0, 7, 14, L - 1):
        wp = torch.full((batch,), w, dtype=torch.int32, device=DEV)
        f = lambda: kernel(qkv, a, b, A_log, dt_bias, K ** -0.5, state, d, kc, gc, out, idx, wp,  # noqa: E731
                           use_qk_l2norm_in_kernel=True, is_kda=kda)
        label = f"peer sglang replay w={w}" if w < L - 1 else "peer sglang replay flush"
        nbytes = batch * ((2 if w == L - 1 else 1) * S + w * ring + ring)
        record(name, batch, label, timed(f), nbytes)
    wp = torch.arange(batch, dtype=torch.int32, device=DEV) % L          # row r at w = r mod L: 1/L of rows flush
    f = lambda: kernel(qkv, a, b, A_log, dt_bias, K ** -0.5, state, d, kc, gc, out, idx, wp,  # noqa: E731
                       use_qk_l2norm_in_kernel=True, is_kda=kda)
    record(name, batch, "peer sglang replay staggered (1/16 of rows flush)", timed(f),
           batch * (S + S / L + (L - 1) / 2 * ring + ring))


def bench_verify(name, spec, batch, peers):
    S = bytes_state(spec)
    ring = bytes_ring_entry(spec)
    for T in (2, 4, 8):
        layer = Layer(spec, batch, max_draft_tokens=7)
        inp = layer.inputs(T)
        fn, _ = layer.step_fn(inp, committed=False)
        layer.set_fill(WINDOW - 1 - T)
        nbytes = batch * (S + (WINDOW - 1 - T) * ring + T * ring + bytes_io(spec, T))
        record(name, batch, f"ours verify T={T} (no flush)", timed(fn), nbytes, T=T)
        if T == 8:
            # speculative decoding's steady state, where some rows flush at a verify: row r holds r mod 16
            # entries, so the half holding 8 or more flush (their state is written too)
            layer.set_staggered()
            record(name, batch, f"ours verify T={T} (half the rows flush)", timed(fn), nbytes + batch // 2 * S, T=T)
        if spec.family != "mamba2" and T == 8:
            # the adapters pass the queries L2-normalised in fp32, where a bf16 query is an exact tf32 operand
            fn, _ = layer.step_fn(dict(inp, q=inp["q"].float()), committed=False)
            layer.set_fill(WINDOW - 1 - T)
            record(name, batch, f"ours verify T={T} (no flush, q fp32 as the adapters pass it)", timed(fn), nbytes,
                   T=T)
            # the same queries in bf16 with the inverse norm as q_scale (exact tf32 operands again)
            q_scale = torch.rsqrt(inp["q"].float().square().sum(-1) + 1e-6)
            fn, _ = layer.step_fn(dict(inp, q_scale=q_scale), committed=False)
            layer.set_fill(WINDOW - 1 - T)
            record(name, batch, f"ours verify T={T} (no flush, q bf16 + q_scale)", timed(fn), nbytes, T=T)
        st = layer.state0
        del layer
        if spec.family == "mamba2":
            snaps = torch.empty(T, *st.shape, device=DEV)
            out = torch.empty_like(inp["x"])
            f = lambda: snapshot_verify(st, snaps, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"],  # noqa: E731
                                        inp["D"], inp["dt_bias"], out)
            record(name, batch, f"baseline mamba2 per-draft snapshots T={T}", timed(f), batch * (1 + T) * S, T=T)
        if spec.family != "mamba2" and "fla_kda" in peers:
            K = spec.head_k_dim
            pool = torch.empty(batch * T, *st.shape[1:], device=DEV)
            pool[:batch].copy_(st)
            # the state after draft t goes to slot n + t * batch; the first column also holds the start
            ind = (torch.arange(batch, device=DEV)[:, None] + batch * torch.arange(T, device=DEV)[None, :]).contiguous()
            cu = torch.arange(0, batch * T + 1, T, device=DEV, dtype=torch.int32)
            gg = inp["g"] if inp["g"].dim() == 4 else inp["g"][..., None].expand(-1, -1, -1, K).contiguous()
            acc = torch.ones(batch, dtype=torch.int32, device=DEV)
            flat = lambda x: x.reshape(1, batch * T, *x.shape[2:])  # noqa: E731
            f = lambda: peers["fla_kda"](flat(inp["q"]), flat(inp["k"]), flat(inp["v"]), flat(gg),  # noqa: E731
                                         flat(inp["beta"]), initial_state=pool, scale=K ** -0.5,
                                         inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=ind,
                                         num_accepted_tokens=acc)
            record(name, batch, f"peer fla kda per-draft snapshots T={T}", timed(f), batch * (1 + T) * S, T=T)
        if spec.family == "gdn" and "fla_gdn" in peers:
            f = lambda: peers["fla_gdn"](inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"],  # noqa: E731
                                         scale=spec.head_k_dim ** -0.5, initial_state=st, output_final_state=True)
            record(name, batch, f"peer fla fused_recurrent T={T} (no snapshots)", timed(f), batch * 2 * S, T=T)


def bench_ceilings():
    """Copy, read and read+write passes over 1 GiB: the bandwidth ceilings of this GPU."""
    src = torch.empty(2 ** 28, device=DEV)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    record("copy", 0, "device copy 1 GiB (read+write)", timed(lambda: dst.copy_(src)), 2 * nbytes)
    record("copy", 0, "device copy 1 GiB, no graph", timed(lambda: dst.copy_(src), graph=False), 2 * nbytes)
    record("copy", 0, "read floor 1 GiB", timed(read_floor(src)), nbytes)
    record("copy", 0, "read+write floor 1 GiB", timed(rw_floor(src)), 2 * nbytes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=".peers")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--models", default=",".join(MODEL_SPECS))
    ap.add_argument("--verify-batch", type=int, default=256)
    ap.add_argument("--json", default=None)
    ap.add_argument("--jsonl", default=None, help="append each row as it is measured")
    args = ap.parse_args()
    global JSONL
    JSONL = args.jsonl
    torch.manual_seed(0)
    peers = load_peers(args.peers)
    print("peers:", sorted(peers), "| GPU:", torch.cuda.get_device_name(), "| torch", torch.__version__,
          "| triton", triton.__version__, flush=True)
    bench_ceilings()
    for name in args.models.split(","):
        spec = MODEL_SPECS[name]
        for batch in map(int, args.batches.split(",")):
            try:
                bench_model(name, spec, batch, peers, args.verify_batch)
            except Exception as e:
                print(f"{name} b={batch} FAILED: {e!r}", flush=True)
            torch.cuda.empty_cache()
        try:
            bench_verify(name, spec, args.verify_batch, peers)
        except Exception as e:
            print(f"{name} verify FAILED: {e!r}", flush=True)
        torch.cuda.empty_cache()
    print_summary()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d", time.gmtime()),
                           commit=os.environ.get("REPLAYSSM_COMMIT", "unknown"), gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__, triton=triton.__version__, command=" ".join(sys.argv),
                           peers=peer_sources(peers), rows=RESULTS, summary=SUMMARY),
                      f, indent=1)


if __name__ == "__main__":
    main()
