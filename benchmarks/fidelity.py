"""Numerical fidelity of long decodes: shared low-precision state vs the precision split.

    python benchmarks/fidelity.py [--steps 4096] [--device cpu|cuda] [--json F.json] [--png F.png]

On a GPU (``--device cuda``) the split runs through the Triton kernels (backend "auto").

For each family, one long decode with slow (long-memory) decays, against a float64 conventional
run of the same inputs:
  shared X: the conventional step with the state stored in X after every token (what frameworks
            do today): bf16, fp16, fp16 with stochastic rounding, fp8, nvfp4;
  split:    replayssm pools: fp32 checkpoint + fp8 / nvfp4 read copy; fp16-SR checkpoint + nvfp4
            read copy; bf16 checkpoint + nvfp4 read copy (window 16); and the fp32 / fp16-SR
            checkpoint read directly (no read copy), which isolates the checkpoint's own rounding.
Metrics per segment of the run: relative output error (RMS ratio over the segment) and the KL
divergence of next-token distributions through a fixed random LM head (vocab 512).

    python benchmarks/fidelity.py --e2e [--steps 2048] [--segment 256] [--json F.json] [--png F.png]

End to end instead: the demo's tiny transformers models (random weights, CPU) decoded ``--steps``
tokens after a prompt, teacher-forced on transformers' own greedy tokens, with the split's replay
caches (exact fp32; fp32 checkpoint + fp8 / nvfp4 read copy; fp16-SR and bf16 checkpoints + nvfp4
read copy) against transformers' cache; per segment the relative logit error and the KL of the
next-token distributions.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

import replayssm as rs
from replayssm import formats
from replayssm.kernels.delta.reference import delta_step_ref
from replayssm.kernels.mamba2.reference import mamba2_step_ref

SPECS = {
    "mamba2": rs.LayerSpec.mamba2(num_heads=4, head_dim=16, state_dim=32, num_groups=2),
    "gdn": rs.LayerSpec.gdn(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32),
    "kda": rs.LayerSpec.kda(num_k_heads=4, num_v_heads=4, head_k_dim=32, head_v_dim=32),
}
SHARED = ("bf16", "fp16", "fp16_sr", "fp8", "nvfp4")
SPLIT = {"fp32 ckpt + fp8 read": ("float32", "fp8"), "fp32 ckpt + nvfp4 read": ("float32", "nvfp4"),
         "fp16-SR ckpt + nvfp4 read": ("float16_sr", "nvfp4"), "bf16 ckpt + nvfp4 read": ("bfloat16", "nvfp4"),
         # the checkpoint read directly: its own rounding (once per flush), with no read copy in front of it
         "fp32 ckpt": ("float32", "checkpoint"), "fp16-SR ckpt": ("float16_sr", "checkpoint")}


def inputs(spec, n, gen, A):
    """One step's inputs with long memory: per-token decays of 0.001 % to 0.4 % (memories of ~250 to
    ~100K tokens), the regime where stored-state rounding accumulates. Drawn on ``gen``'s device."""
    dev = gen.device
    randn = lambda *shape: torch.randn(*shape, generator=gen, device=dev)  # noqa: E731
    rand = lambda *shape: torch.rand(*shape, generator=gen, device=dev)  # noqa: E731
    if spec.family == "mamba2":
        H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
        return dict(x=randn(n, H, P), dt=rand(n, H) * 2 - 6, A=A, B=randn(n, G, N) * 0.3, C=randn(n, G, N) * 0.3,
                    D=torch.ones(H, device=dev), dt_bias=torch.zeros(H, device=dev))
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    g = (n, HV) if spec.family == "gdn" else (n, HV, K)
    return dict(q=randn(n, HK, K), k=torch.nn.functional.normalize(randn(n, HK, K), dim=-1), v=randn(n, HV, V),
                g=-torch.exp(rand(*g) * 4.6 - 11.5), beta=rand(n, HV) * 0.5)


def step(spec, state, inp):
    if spec.family == "mamba2":
        return mamba2_step_ref(state, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["D"], inp["dt_bias"])
    return delta_step_ref(state, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], spec.head_k_dim ** -0.5)


def store_shared(spec, state, fmt, gen):
    """Round an fp32 state as a framework storing it in ``fmt`` would."""
    if fmt == "bf16":
        return state.to(torch.bfloat16).float()
    if fmt == "fp16":
        return state.to(torch.float16).float()
    if fmt == "fp16_sr":
        return formats.fp16_stochastic_round(state, torch.rand(state.shape, generator=gen, device=state.device)).float()
    x = state.transpose(-1, -2) if spec.is_delta else state
    y = formats.dequantize(*formats.quantize(x, fmt), fmt)
    return y.transpose(-1, -2) if spec.is_delta else y


def run_family(spec, steps, n, segment, seed=0, device="cpu"):
    """Curves per run: relative output error and KL per ``segment`` steps. Everything stays on
    ``device`` (inputs drawn there, sums accumulated there) and the host reads the sums once per
    segment, so a GPU run is not held up by a synchronization per step."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dev = gen.device
    A = -torch.exp(torch.rand(spec.num_heads, generator=gen, device=dev) * 3.0 - 4.6) \
        if spec.family == "mamba2" else None
    out_dim = spec.num_heads * spec.head_dim if spec.family == "mamba2" else spec.num_v_heads * spec.head_v_dim
    head = torch.randn(512, out_dim, generator=gen, device=dev, dtype=torch.float64) / math.sqrt(out_dim) * 4
    truth = torch.zeros(n, *spec.state_shape, dtype=torch.float64, device=dev)
    shared = {f: torch.zeros(n, *spec.state_shape, device=dev) for f in SHARED}
    fp32 = torch.zeros(n, *spec.state_shape, device=dev)
    pools = {}
    for name, (ck, rf) in SPLIT.items():
        pool = rs.StatePool(spec, rs.ReplayConfig(window=16, checkpoint_dtype=ck, read_format=rf, seed=seed),
                            num_layers=1, num_slots=n, device=dev, backend="auto")
        pools[name] = (pool, pool.alloc(n))
    runs = ["fp32 conventional"] + [f"shared {f}" for f in SHARED] + list(SPLIT)
    acc = torch.zeros(len(runs), 3, dtype=torch.float64, device=dev)      # per run: err, ref, kl sums
    curves = {r: [] for r in runs}
    sr_gen = torch.Generator(device=device).manual_seed(seed + 1)
    for t in range(steps):
        inp = inputs(spec, n, gen, A)
        y_true, truth = step(spec, truth, {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()})
        ys = {}
        ys["fp32 conventional"], fp32 = step(spec, fp32, inp)
        for f in SHARED:
            y, s = step(spec, shared[f], inp)
            ys[f"shared {f}"] = y
            shared[f] = store_shared(spec, s, f, sr_gen)
        for name, (pool, slots) in pools.items():
            ys[name] = rs.decode(pool, 0, slots, checked=pool.backend != "triton", **inp)
        yd = torch.stack([ys[r].reshape(n, -1) for r in runs]).double()                  # [runs, n, out]
        yt = y_true.reshape(n, -1)
        logp_true = torch.log_softmax(yt @ head.T, -1)
        logp = torch.log_softmax(yd @ head.T, -1)
        acc += torch.stack(((yd - yt).pow(2).sum((1, 2)), yt.pow(2).sum().expand(len(runs)),
                            (logp_true.exp() * (logp_true - logp)).sum(-1).mean(-1)), 1)
        if (t + 1) % segment == 0:
            for r, (err, ref, kl) in zip(runs, acc.tolist()):
                curves[r].append(dict(step=t + 1, rel_err=math.sqrt(err / ref), kl=kl / segment))
            acc.zero_()
    return curves


E2E = {"replay (fp32 ckpt)": ("float32", "checkpoint"), "fp32 ckpt + fp8 read": ("float32", "fp8"),
       "fp32 ckpt + nvfp4 read": ("float32", "nvfp4"), "fp16-SR ckpt + nvfp4 read": ("float16_sr", "nvfp4"),
       "bf16 ckpt + nvfp4 read": ("bfloat16", "nvfp4")}


def run_e2e(name: str, steps: int, segment: int, window: int = 16, seed: int = 0) -> dict:
    """The demo's tiny transformers model ``name`` through the :data:`E2E` replay caches (see the
    module docs): ``{run: [{step, rel_err, kl} per segment]}``."""
    import contextlib

    from transformers import DynamicCache

    from replayssm.integrations.transformers.cache import ReplayCache
    from replayssm.integrations.transformers.demo import PROMPT_LEN, decode_greedy, logit_drift, next_token_kl
    from replayssm.integrations.transformers.models import tiny_model

    model = tiny_model(name, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, model.config.vocab_size, (1, PROMPT_LEN), generator=gen)
    ref = decode_greedy(model, DynamicCache(config=model.config), contextlib.nullcontext(), prompt, steps,
                        lambda n: None)
    curves = {}
    for run, (ckpt, fmt) in E2E.items():
        cache = ReplayCache(model, rs.ReplayConfig(window=window, checkpoint_dtype=ckpt, read_format=fmt),
                            batch_size=1, backend="reference")
        out = decode_greedy(model, cache, cache.routing(), prompt, steps, lambda n: None, teacher=ref.tokens)
        drift, kl = logit_drift(out, ref), next_token_kl(out, ref)
        curves[run] = [dict(step=end, rel_err=drift[end - segment:end].mean().item(),
                            kl=kl[end - segment:end].mean().item()) for end in range(segment, steps + 1, segment)]
    return curves


def table(results):
    lines = ["| family | run | rel. error first segment | rel. error last segment | KL last segment |",
             "|---|---|---|---|---|"]
    for fam, curves in results.items():
        for run, pts in curves.items():
            lines.append(f"| {fam} | {run} | {pts[0]['rel_err']:.2e} | {pts[-1]['rel_err']:.2e} | {pts[-1]['kl']:.2e} |")
    return "\n".join(lines)


def plot(results, path, ylabel="relative output error vs float64",
         title="Shared low-precision state (dashed) vs the precision split (solid)"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5))
    for ax, (fam, curves) in zip(axes, results.items()):
        for run, pts in curves.items():
            style = "-" if not run.startswith("shared") else "--"
            ax.plot([p["step"] for p in pts], [p["rel_err"] for p in pts], style, label=run)
        ax.set_yscale("log")
        ax.set_title(fam)
        ax.set_xlabel("decode step")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--segment", type=int, default=256)
    ap.add_argument("--families", default=",".join(SPECS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    ap.add_argument("--merge", nargs="+", default=None,
                    help="instead of running: merge the --json files of runs (e.g. one per family, run in parallel)")
    ap.add_argument("--e2e", action="store_true", help="end to end through the demo's tiny transformers models")
    args = ap.parse_args()
    results = {}
    if args.e2e:
        import transformers

        from replayssm.integrations.transformers.models import MODELS

        transformers.logging.set_verbosity_error()
        torch.set_num_threads(1)
        for name in MODELS:
            results[name] = run_e2e(name, args.steps, args.segment)
            print(f"{name} done", flush=True)
    elif args.merge:
        for path in args.merge:
            with open(path) as f:
                run = json.load(f)
            args.steps, args.batch, args.segment = run["steps"], run["batch"], run["segment"]
            results.update(run["results"])
    else:
        for fam in args.families.split(","):
            results[fam] = run_family(SPECS[fam], args.steps, args.batch, args.segment, device=args.device)
            print(f"{fam} done", flush=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(steps=args.steps, batch=args.batch, segment=args.segment, results=results), f, indent=1)
    if args.png and args.e2e:
        plot(results, args.png, "relative logit error vs transformers' cache",
             "The split end to end: the demo's tiny transformers models, teacher-forced")
    elif args.png:
        plot(results, args.png)


if __name__ == "__main__":
    main()
