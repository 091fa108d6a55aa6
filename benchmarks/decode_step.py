"""Decode step of a hybrid layer stack: conventional SSM steps vs replay vs replay + NVFP4 read copy.

    python benchmarks/decode_step.py [--stacks nemotron-h-8b,qwen3.5-9b] [--batches 1,64,256,512]
                                     [--context 4096] [--peers .peers] [--json OUT.json]
                                     [--staggered]                                            (GPU)
    python benchmarks/decode_step.py --smoke                                                  (CPU)

A stack is the decode step of a whole model body at real dims with random bf16 weights: RMSNorm
and a residual around every sublayer; SSM mixers with their input projection, causal conv
(width 4, rolling conv state), gating, gated RMSNorm and output projection; MLPs; and a few
attention layers over a KV cache of ``--context`` tokens (SDPA). Only the SSM state update
differs between the variants:

- ``conventional``: a kernel that reads and writes the whole fp32 state every token: mamba_ssm's
  ``selective_state_update`` (Mamba-2) and fla's ``fused_recurrent_kda_fwd`` with the GDN gate
  broadcast over K and ``inplace_final_state`` (the in-place fla kernel; fla's GDN kernel returns
  a new final state instead). Both are loaded from ``--peers`` as in bench_decode.py.
- ``replay``: replayssm, window 16, fp32 checkpoint, steps with ``checked=False``.
- ``replay + nvfp4``: the same with an NVFP4 read copy.
- ``no ssm``: the step with the SSM state update skipped, for the SSM share.

Each variant's whole step is captured in one CUDA graph and timed with triton's ``do_bench``;
replaying the graph runs consecutive decode steps (replay's cursors advance on the device, so
every 16th replay flushes). Reported: the median of single steps (the non-flush step) and the
amortized step, the median over runs of 16 consecutive replays (one whole window, its flush
included) divided by 16; the SSM share and the speedup are of amortized steps. By default every
row's cursor moves together (all rows flush at the same replay); ``--staggered`` first brings
the replay variants' rows to r mod 16 committed entries (``Model.stagger``), the serving steady
state where each step flushes 1/16 of the rows. ``--smoke`` runs tiny dims on the CPU with the reference
backend and the PyTorch step references as the conventional step, and prints how far the replay
variants' step outputs are from the conventional ones (teacher-forced).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import replayssm as rs  # noqa: E402
from replayssm.kernels.delta.reference import delta_step_ref  # noqa: E402
from replayssm.kernels.mamba2.reference import mamba2_step_ref  # noqa: E402
from replayssm.spec import model_layer  # noqa: E402

ACT = torch.bfloat16
CONV = 4
WINDOW = 16        # replay window L (steps per flush)


@dataclass(frozen=True)
class Stack:
    """A model body: ``pattern`` has one letter per sublayer (S: SSM mixer, M: MLP, A: attention)."""

    name: str
    hidden: int
    pattern: str
    ssm: rs.LayerSpec
    mlp: int
    mlp_act: str          # "relu2" (Nemotron-H) or "swiglu" (Qwen3.5)
    heads: int
    kv_heads: int
    head_dim: int


STACKS = {
    # 52 sublayers: 24 Mamba-2, 24 MLP, 4 attention (Nemotron-H-8B's counts)
    "nemotron-h-8b": Stack("nemotron-h-8b", 4096, "SMSMSMSMSMSMA" * 4, model_layer("nemotron-h"),
                           21504, "relu2", 32, 8, 128),
    # 32 blocks of mixer + MLP, mixers GDN : attention = 3 : 1 (Qwen3.5-9B-like dims)
    "qwen3.5-9b": Stack("qwen3.5-9b", 4096, "SMSMSMAM" * 8, model_layer("qwen3.5"),
                        12288, "swiglu", 16, 4, 256),
    "tiny-mamba2": Stack("tiny-mamba2", 64, "SMSA", rs.LayerSpec.mamba2(num_heads=4, head_dim=8, state_dim=16,
                                                                        num_groups=2), 96, "relu2", 4, 2, 16),
    "tiny-gdn": Stack("tiny-gdn", 64, "SMAMSM", rs.LayerSpec.gdn(num_k_heads=2, num_v_heads=4, head_k_dim=16,
                                                                 head_v_dim=16), 96, "swiglu", 4, 2, 16),
}


def _w(gen, dev, rows, cols):
    return (torch.randn(rows, cols, generator=gen, device=dev) / math.sqrt(cols)).to(ACT)


def _rms(x):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(ACT)


class Model:
    """Weights, caches and the SSM pools of one stack at one batch; ``step(h)`` is one decode step."""

    def __init__(self, st: Stack, batch: int, context: int, variant: str, dev, peers: dict, seed: int = 0):
        self.st, self.n, self.variant, self.dev, self.peers = st, batch, variant, dev, peers
        gen = torch.Generator(device=dev).manual_seed(seed)
        s, D = st.ssm, st.hidden
        self.layers = []
        num_ssm = st.pattern.count("S")
        if s.family == "mamba2":
            self.inner = s.num_heads * s.head_dim
            self.conv_ch = self.inner + 2 * s.num_groups * s.state_dim
            proj = 2 * self.inner + 2 * s.num_groups * s.state_dim + s.num_heads       # z, xBC, dt
        else:
            self.qk = s.num_k_heads * s.head_k_dim
            self.inner = s.num_v_heads * s.head_v_dim
            self.conv_ch = 2 * self.qk + self.inner
            proj = self.conv_ch + self.inner + 2 * s.num_v_heads                       # qkv, z, b, a
        heads = s.num_heads if s.family == "mamba2" else s.num_v_heads
        for kind in st.pattern:
            if kind == "S":
                layer = dict(kind=kind, w_in=_w(gen, dev, proj, D), w_out=_w(gen, dev, D, self.inner),
                             conv_w=torch.randn(self.conv_ch, CONV, generator=gen, device=dev) * 0.5,
                             conv=torch.zeros(batch, self.conv_ch, CONV - 1, device=dev, dtype=ACT),
                             A=-torch.exp(torch.rand(heads, generator=gen, device=dev) * 2 - 3),
                             dt_bias=torch.rand(heads, generator=gen, device=dev) - 2,
                             D=torch.ones(heads, device=dev))
            elif kind == "M":
                up = 2 * st.mlp if st.mlp_act == "swiglu" else st.mlp
                layer = dict(kind=kind, w_up=_w(gen, dev, up, D), w_down=_w(gen, dev, D, st.mlp))
            else:
                qkv = (st.heads + 2 * st.kv_heads) * st.head_dim
                kv = torch.randn(2, batch, st.kv_heads, context, st.head_dim, generator=gen, device=dev).to(ACT)
                layer = dict(kind=kind, w_qkv=_w(gen, dev, qkv, D), w_o=_w(gen, dev, D, st.heads * st.head_dim),
                             k=kv[0], v=kv[1])
            self.layers.append(layer)
        self.ssm_index = {i: j for j, i in enumerate(i for i, k in enumerate(st.pattern) if k == "S")}
        state_shape = (num_ssm, batch, *s.state_shape)
        if variant == "conventional":
            self.state = torch.zeros(state_shape, device=dev)
        elif variant.startswith("replay"):
            cfg = rs.ReplayConfig(window=WINDOW, read_format="nvfp4" if variant.endswith("nvfp4") else "checkpoint",
                                  ring_dtype="bfloat16")
            self.pool = rs.StatePool(s, cfg, num_layers=num_ssm, num_slots=batch, device=dev,
                                     backend="triton" if torch.device(dev).type == "cuda" else "reference")
            self.slots = self.pool.alloc(batch)
            self.checked = self.pool.backend != "triton"

    def stagger(self, h: torch.Tensor) -> None:
        """A replay variant's cursors as in serving: WINDOW - 1 decode steps in which row r takes
        part r mod WINDOW times (padded out of the others), so that row r then holds r mod WINDOW
        committed entries in every layer and each later step flushes 1/WINDOW of the rows."""
        slots = self.slots
        fill = torch.arange(self.n, device=slots.device) % WINDOW
        for k in range(WINDOW - 1):
            self.slots = torch.where(fill > k, slots, -1)
            self.step(h)
        self.slots = slots

    def step(self, h: torch.Tensor) -> torch.Tensor:
        """One decode step: ``h [n, hidden]`` bf16 -> ``[n, hidden]``; caches and states updated in place."""
        for i, layer in enumerate(self.layers):
            x = _rms(h)
            if layer["kind"] == "S":
                h = h + self._mixer(i, layer, x)
            elif layer["kind"] == "M":
                u = x @ layer["w_up"].T
                if self.st.mlp_act == "swiglu":
                    gate, up = u.chunk(2, -1)
                    u = F.silu(gate) * up
                else:
                    u = F.relu(u).square()
                h = h + u @ layer["w_down"].T
            else:
                h = h + self._attention(layer, x)
        return h

    def _conv(self, layer, xbc):
        # rolling conv state [n, C, 3] (bf16) and this token: depthwise width-4 causal conv, silu
        window = torch.cat((layer["conv"], xbc[..., None]), -1)
        layer["conv"].copy_(window[..., 1:])
        return F.silu((window.float() * layer["conv_w"]).sum(-1)).to(ACT)

    def _mixer(self, i, layer, x):
        s, n = self.st.ssm, self.n
        u = x @ layer["w_in"].T
        if s.family == "mamba2":
            H, P, N, G = s.num_heads, s.head_dim, s.state_dim, s.num_groups
            z, xbc, dt = u.split((self.inner, self.conv_ch, H), -1)
            xbc = self._conv(layer, xbc)
            xs, B, C = xbc.split((self.inner, G * N, G * N), -1)
            # the projection's slices are strided views; the ops take a dense last axis
            inp = dict(x=xs.reshape(n, H, P).contiguous(), dt=dt.float(), A=layer["A"],
                       B=B.reshape(n, G, N).contiguous(), C=C.reshape(n, G, N).contiguous(), D=layer["D"],
                       dt_bias=layer["dt_bias"], z=z.reshape(n, H, P).contiguous())
            y = self._ssm(i, inp)                                    # y * silu(z), [n, H, P]
        else:
            HK, HV, K, V = s.num_k_heads, s.num_v_heads, s.head_k_dim, s.head_v_dim
            qkv, z, b, a = u.split((self.conv_ch, self.inner, HV, HV), -1)
            qkv = self._conv(layer, qkv)
            q, k, v = qkv.split((self.qk, self.qk, self.inner), -1)
            g = -torch.exp(layer["A"]) * F.softplus(a.float() + layer["dt_bias"])
            inp = dict(q=F.normalize(q.reshape(n, HK, K).float(), dim=-1),
                       k=F.normalize(k.reshape(n, HK, K).float(), dim=-1).to(ACT),
                       v=v.reshape(n, HV, V).contiguous(), g=g, beta=torch.sigmoid(b.float()))
            y = self._ssm(i, inp) * F.silu(z.reshape(n, HV, V))
        return _rms(y.reshape(n, -1)) @ layer["w_out"].T

    def _ssm(self, i, inp):
        s, j = self.st.ssm, self.ssm_index[i]
        if self.variant == "no ssm":
            return inp["x"] if s.family == "mamba2" else inp["v"]
        if self.variant.startswith("replay"):
            return rs.decode(self.pool, j, self.slots, checked=self.checked, **inp)
        state = self.state[j]
        if self.dev == "cpu" or not self.peers:
            if s.family == "mamba2":
                y, new = mamba2_step_ref(state, inp["x"].float(), inp["dt"], inp["A"], inp["B"].float(),
                                         inp["C"].float(), inp["D"], inp["dt_bias"], inp["z"].float())
            else:
                y, new = delta_step_ref(state, inp["q"], inp["k"].float(), inp["v"].float(), inp["g"], inp["beta"],
                                        s.head_k_dim ** -0.5)
            state.copy_(new)
            return y.to(ACT)
        if s.family == "mamba2":
            H, P, N = s.num_heads, s.head_dim, s.state_dim
            return self.peers["mamba_ssm"](
                state, inp["x"], inp["dt"][..., None].expand(-1, H, P), inp["A"][:, None, None].expand(H, P, N),
                inp["B"], inp["C"], D=inp["D"][:, None].expand(H, P), z=inp["z"],
                dt_bias=inp["dt_bias"][:, None].expand(H, P), dt_softplus=True)
        K = s.head_k_dim
        y, _ = self.peers["fla_kda"](inp["q"][:, None], inp["k"][:, None], inp["v"][:, None],
                                     inp["g"][:, None, :, None].expand(-1, 1, -1, K).contiguous(),
                                     inp["beta"][:, None], initial_state=state, scale=K ** -0.5,
                                     inplace_final_state=True)
        return y[:, 0]

    def _attention(self, layer, x):
        st, n = self.st, self.n
        qkv = x @ layer["w_qkv"].T
        q, k, v = qkv.split((st.heads * st.head_dim, st.kv_heads * st.head_dim, st.kv_heads * st.head_dim), -1)
        # this token's key and value take the cache's last position (a fixed slot keeps replays stationary)
        layer["k"][:, :, -1].copy_(k.reshape(n, st.kv_heads, st.head_dim))
        layer["v"][:, :, -1].copy_(v.reshape(n, st.kv_heads, st.head_dim))
        o = F.scaled_dot_product_attention(q.reshape(n, st.heads, 1, st.head_dim), layer["k"], layer["v"],
                                           enable_gqa=True)
        return o.reshape(n, -1) @ layer["w_o"].T


def smoke(steps: int = 20) -> dict:
    """Tiny stacks on the CPU, teacher-forced (every variant steps from the conventional run's
    hidden state, so only the SSM states can differ): the largest relative difference of a
    replay variant's step output from the conventional step's."""
    worst = {}
    for name in ("tiny-mamba2", "tiny-gdn"):
        st = STACKS[name]
        models = {v: Model(st, 3, 8, v, "cpu", {}) for v in ("conventional", "replay", "replay + nvfp4")}
        h = torch.randn(3, st.hidden, generator=torch.Generator().manual_seed(1)).to(ACT)
        worst[name] = dict.fromkeys(("replay", "replay + nvfp4"), 0.0)
        for _ in range(steps):
            outs = {v: m.step(h).float() for v, m in models.items()}
            ref = outs["conventional"]
            for v in worst[name]:
                worst[name][v] = max(worst[name][v], ((outs[v] - ref).norm() / ref.norm()).item())
            h = _rms(ref.to(ACT))
    return worst


def bench(stacks, batches, context, peers, staggered=False) -> list[dict]:
    from triton.testing import do_bench

    rows = []
    for name in stacks:
        st = STACKS[name]
        for batch in batches:
            times = {}
            for variant in ("conventional", "replay", "replay + nvfp4", "no ssm"):
                model = Model(st, batch, context, variant, "cuda", peers)
                h = torch.randn(batch, st.hidden, device="cuda").to(ACT)
                model.step(h)                                          # compile outside the capture
                if staggered and variant.startswith("replay"):
                    model.stagger(h)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model.step(h)
                def window(graph=graph):
                    for _ in range(WINDOW):
                        graph.replay()

                times[variant] = (do_bench(graph.replay, warmup=25, rep=200) * 1e3,
                                  do_bench(window, warmup=1, rep=1000) * 1e3 / WINDOW)
                del model, graph, window
                torch.cuda.empty_cache()
            med = {v: t[0] for v, t in times.items()}
            amortized = {v: t[1] for v, t in times.items()}
            for v in ("conventional", "replay", "replay + nvfp4"):
                rows.append(dict(stack=name, batch=batch, variant=v, cursors="staggered" if staggered else "window",
                                 median_us=round(med[v], 1),
                                 amortized_us=round(amortized[v], 1),
                                 ssm_share=round(1 - amortized["no ssm"] / amortized[v], 3),
                                 speedup=round(amortized["conventional"] / amortized[v], 3)))
                print(f"{name:14s} b={batch:<4d} {v:16s} step median {med[v]:9.1f} us  amortized {amortized[v]:9.1f} us"
                      f"  SSM share {rows[-1]['ssm_share']:.0%}  speedup {rows[-1]['speedup']:.2f}x", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stacks", default="nemotron-h-8b,qwen3.5-9b")
    ap.add_argument("--batches", default="1,64,256,512")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--peers", default=".peers")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--staggered", action="store_true",
                    help="replay rows' cursors staggered as in serving (1/16 of the rows flush at each step)")
    args = ap.parse_args()
    if args.smoke:
        for name, errs in smoke().items():
            print(name, " ".join(f"{v}: max rel. diff {e:.2e}" for v, e in errs.items()))
        return
    from bench_decode import load_peers
    peers = load_peers(args.peers)
    if not {"mamba_ssm", "fla_kda"} <= set(peers):
        raise SystemExit(f"--peers: the conventional step needs mamba_ssm and fla from {args.peers}")
    rows = bench(args.stacks.split(","), [int(b) for b in args.batches.split(",")], args.context, peers,
                 args.staggered)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), context=args.context, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
