"""Decode transformers' own hybrid models with their recurrent state in replayssm.

``python -m replayssm.demo [--device cpu|cuda] [--steps N] [--batch N]``. For each tiny model (NemotronH:
Mamba-2, Qwen3-Next and Qwen3.5: GDN, KimiLinear: KDA; seeded random weights, built in memory) it prefills
a prompt with the model's own code, then decodes greedily:

- ``hf cache``: transformers' DynamicCache, the model's own recurrence (the reference);
- ``replay``: a ReplayCache (fp32 checkpoint, read format "checkpoint");
- ``replay spec``: prompt-lookup drafts verified through ``replayssm.verify`` and committed with
  ``pool.commit`` (compared with greedy decoding);
- ``replay fp8`` / ``replay nvfp4``: read copies for the outputs, fed the reference tokens
  (teacher-forced) so that their logits compare step by step;
- ``replay b=N`` (``--batch N``; 64 by default on CUDA): N prompts decoded at once with
  transformers' cache and with a ReplayCache of N slots; rows with identical tokens, tokens/s.

It prints one table (tokens identical, largest and median relative logit difference against
the reference, recurrent-state bytes written per generated token, decode time) and writes a PNG
of the logit difference per step. On CUDA the pool runs the Triton kernels (backend "auto"); elsewhere the
reference backend.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import replayssm as rs

from .cache import ReplayCache
from .models import MODELS, tiny_model

PROMPT_LEN = 32
READ_FORMATS = ("fp8", "nvfp4")


@dataclass
class Run:
    """One decode of ``steps`` tokens: tokens, the logits that chose them ``[steps, vocab]`` fp32,
    recurrent-state bytes written after the prefill, decode seconds, mode-specific notes."""

    tokens: list[int]
    logits: torch.Tensor
    bytes_written: float
    seconds: float
    notes: dict = field(default_factory=dict)


def lookup_drafts(tokens: list[int], k: int, ngram: int = 3) -> list[int]:
    """Prompt-lookup drafts: the up to ``k`` tokens that followed the latest earlier occurrence of
    the longest suffix of ``tokens`` (``ngram`` tokens at most) seen before; [] if none."""
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


def _recurrent_bytes_per_step(cache) -> int:
    """Bytes of every recurrent state a conventional decode step writes (DynamicCache after a prefill)."""
    return sum(layer.recurrent_states[0].numel() * layer.recurrent_states[0].element_size()
               for layer in cache.layers
               if getattr(layer, "is_recurrent_states_initialized", {}).get(0))


@torch.no_grad()
def decode_greedy(model, cache, routing, prompt: torch.Tensor, steps: int, tick, teacher: list[int] | None = None,
                  ) -> Run:
    """Prefill ``prompt`` (int64 ``[1, L]``), then decode ``steps`` tokens one forward at a time.

    ``routing``: context the model runs in (``cache.routing()`` or a null context). With
    ``teacher``, feeds those tokens instead of its own choices (logits still recorded).
    """
    tokens, rows = [], []
    with routing:
        logits = model(prompt, past_key_values=cache, use_cache=True).logits[0, -1]
        t0 = time.perf_counter()
        for s in range(steps):
            rows.append(logits.float())
            tokens.append(int(logits.argmax()))
            tick(1)
            if s + 1 < steps:
                feed = tokens[-1] if teacher is None else teacher[s]
                logits = model(torch.tensor([[feed]], device=prompt.device), past_key_values=cache,
                               use_cache=True).logits[0, -1]
        seconds = time.perf_counter() - t0
    written = cache.state_bytes_written() if isinstance(cache, ReplayCache) else \
        _recurrent_bytes_per_step(cache) * (steps - 1)
    return Run(tokens, torch.stack(rows).cpu(), written, seconds)


@torch.no_grad()
def decode_batch(model, cache, routing, prompts: torch.Tensor, steps: int, tick) -> tuple[torch.Tensor, float]:
    """Prefill ``prompts`` (int64 ``[B, L]``, one sequence per row), then decode ``steps`` greedy
    tokens for every row, one forward per step. Returns (tokens int64 ``[B, steps]``, decode seconds)."""
    out = []
    with routing:
        logits = model(prompts, past_key_values=cache, use_cache=True).logits[:, -1]
        if prompts.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(steps):
            out.append(logits.argmax(-1))
            tick(1)
            if s + 1 < steps:
                logits = model(out[-1][:, None], past_key_values=cache, use_cache=True).logits[:, -1]
        tokens = torch.stack(out, 1).cpu()
        seconds = time.perf_counter() - t0
    return tokens, seconds


@torch.no_grad()
def decode_speculative(model, cache: ReplayCache, prompt: torch.Tensor, steps: int, tick,
                       draft=lookup_drafts) -> Run:
    """Greedy decoding with drafts: each forward verifies the last token plus up to
    ``cache.pool.cfg.max_draft_tokens`` drafts, keeps the drafts the model agrees with and its own
    next token (``cache.commit``). Returns ``steps`` tokens and the logits that chose them.

    ``draft(tokens, k)``: up to ``k`` guesses of the tokens after ``tokens`` (prompt and output
    so far, a list of ints); prompt lookup by default.
    """
    k = cache.pool.cfg.max_draft_tokens
    history = prompt[0].tolist()
    tokens, rows = [], []
    drafted = accepted = 0
    with cache.routing():
        logits = model(prompt, past_key_values=cache, use_cache=True).logits[0, -1:]
        t0 = time.perf_counter()
        tokens.append(int(logits[0].argmax()))
        rows.append(logits[0].float())
        tick(1)
        while len(tokens) < steps:
            room = min(k, steps - len(tokens) - 1)
            drafts = list(draft(history + tokens, room))[:room]
            feed = torch.tensor([[tokens[-1], *drafts]], device=prompt.device)
            logits = model(feed, past_key_values=cache, use_cache=True).logits[0]     # [T, vocab]
            choice = logits.argmax(-1).tolist()
            m = 0
            while m < len(drafts) and drafts[m] == choice[m]:
                m += 1
            cache.commit(m + 1)
            tokens.extend(choice[:m + 1])
            rows.extend(logits[:m + 1].float())
            drafted, accepted = drafted + len(drafts), accepted + m
            tick(m + 1)
        seconds = time.perf_counter() - t0
    notes = dict(drafted=drafted, accepted=accepted, checkpoint_writes=cache.checkpoint_writes())
    return Run(tokens, torch.stack(rows).cpu(), cache.state_bytes_written(), seconds, notes)


def logit_drift(run: Run, ref: Run) -> torch.Tensor:
    """Relative logit difference per step ``||l - l_ref|| / ||l_ref||``, fp32 ``[steps]``."""
    return (run.logits - ref.logits).norm(dim=-1) / ref.logits.norm(dim=-1)


def next_token_kl(run: Run, ref: Run) -> torch.Tensor:
    """KL(p_ref || p_run) of the next-token distributions per step, in nats, fp32 ``[steps]``."""
    lp_ref = torch.log_softmax(ref.logits.double(), -1)
    return (lp_ref.exp() * (lp_ref - torch.log_softmax(run.logits.double(), -1))).sum(-1).float()


def run_family(name: str, *, steps: int, window: int, drafts: int, device: str, seed: int, tick,
               batch: int = 1) -> list[dict]:
    """Every mode for one model; one table row (a dict) per mode, with its per-step drift. With
    ``batch`` > 1 also a batched greedy decode of ``batch`` prompts (transformers' cache vs replay)."""
    model = tiny_model(name, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, model.config.vocab_size, (1, PROMPT_LEN), generator=gen).to(device)
    from transformers import DynamicCache

    def replay(read_format: str, max_draft: int = 0) -> ReplayCache:
        cfg = rs.ReplayConfig(window=window, max_draft_tokens=max_draft, read_format=read_format)
        return ReplayCache(model, cfg, batch_size=1, backend="auto")

    ref = decode_greedy(model, DynamicCache(config=model.config), contextlib.nullcontext(), prompt, steps, tick)
    rows = [dict(family=name, mode="hf cache", run=ref, same="reference", drift=None, notes="")]
    cache = replay("checkpoint")
    run = decode_greedy(model, cache, cache.routing(), prompt, steps, tick)
    rows.append(dict(family=name, mode="replay", run=run, same=_same(run, ref), drift=logit_drift(run, ref),
                     kl=next_token_kl(run, ref), backend=cache.pool.backend,
                     notes=f"window {window}, {cache.checkpoint_writes()} checkpoint writes"))
    cache = replay("checkpoint", drafts)
    run = decode_speculative(model, cache, prompt, steps, tick)
    n = run.notes
    rate = n["accepted"] / max(n["drafted"], 1)
    rows.append(dict(family=name, mode="replay spec", run=run, same=_same(run, ref), drift=logit_drift(run, ref),
                     kl=next_token_kl(run, ref), notes=f"{n['accepted']}/{n['drafted']} drafts accepted ({rate:.0%}), "
                           f"{n['checkpoint_writes']} checkpoint writes (flushes), no state snapshots"))
    for fmt in READ_FORMATS:
        cache = replay(fmt)
        run = decode_greedy(model, cache, cache.routing(), prompt, steps, tick, teacher=ref.tokens)
        agree = sum(a == b for a, b in zip(run.tokens, ref.tokens))
        rows.append(dict(family=name, mode=f"replay {fmt}", run=run, same=f"{agree}/{steps} (forced)",
                         drift=logit_drift(run, ref), kl=next_token_kl(run, ref),
                         notes="teacher-forced on the reference tokens"))
    if batch > 1:
        prompts = torch.randint(3, model.config.vocab_size, (batch, PROMPT_LEN), generator=gen).to(device)
        ref_tokens, ref_seconds = decode_batch(model, DynamicCache(config=model.config), contextlib.nullcontext(),
                                               prompts, steps, tick)
        cache = ReplayCache(model, rs.ReplayConfig(window=window), batch_size=batch, backend="auto")
        tokens, seconds = decode_batch(model, cache, cache.routing(), prompts, steps, tick)
        same = int((tokens == ref_tokens).all(1).sum())
        run = Run(tokens.flatten().tolist(), torch.empty(0), cache.state_bytes_written() / batch, seconds)
        rows.append(dict(family=name, mode=f"replay b={batch}", run=run, kl=None, drift=None,
                         same=f"{'yes' if same == batch else 'NO'} {same}/{batch} rows",
                         notes=f"{batch * steps / seconds:,.0f} tok/s (transformers' cache "
                               f"{batch * steps / ref_seconds:,.0f} tok/s)"))
    return rows


def _same(run: Run, ref: Run) -> str:
    same = run.tokens == ref.tokens
    agree = sum(a == b for a, b in zip(run.tokens, ref.tokens))
    return f"{'yes' if same else 'NO'} {agree}/{len(ref.tokens)}"


def format_table(rows: list[dict], steps: int) -> str:
    """The demo's table: one line per (family, mode)."""
    head = (f"{'family':12} {'mode':13} {'tokens identical':17} {'logit drift max / median':>24} "
            f"{'KL mean':>8} {'state B written/token':>22} {'decode s':>9}  notes")
    lines = [head, "-" * len(head)]
    for r in rows:
        d = r["drift"]
        drift = "-" if d is None else f"{d.max().item():.1e} / {d[1:].median().item():.1e}"
        kl = "-" if r.get("kl") is None else f"{r['kl'][1:].mean().item():.1e}"
        per_token = r["run"].bytes_written / (steps - 1)
        lines.append(f"{r['family']:12} {r['mode']:13} {r['same']:17} {drift:>24} {kl:>8} {per_token:22,.0f} "
                     f"{r['run'].seconds:9.2f}  {r['notes']}")
    lines += ["logit drift: ||logits - transformers' logits|| / ||transformers' logits|| per decode step; "
              "KL mean: KL(p_transformers || p) of the next-token distributions, nats, mean over the decode steps.",
              "state B written/token: recurrent-state bytes written per generated token, all layers "
              "(transformers: the whole fp32 state every step; replay: ring entries, drafts included, plus "
              "checkpoint and read copy at each flush)."]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Per-step relative logit drift against the reference, one panel per family (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(r["family"] for r in rows))
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 3.8), sharey=True)
    for ax, fam in zip(axes, families):
        for r in rows:
            if r["family"] == fam and r["drift"] is not None:
                per_token = r["run"].bytes_written / (len(r["run"].tokens) - 1)
                steps = torch.arange(1, len(r["drift"]))  # step 0's logits come from the prefill
                ax.semilogy(steps.numpy(), r["drift"][1:].clamp_min(1e-12).numpy(),
                            label=f"{r['mode']} ({per_token:,.0f} B/token)", lw=1)
        ax.set_title(fam)
        ax.set_xlabel("decode step")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("relative logit difference vs transformers' cache")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m replayssm.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (Triton kernels)")
    ap.add_argument("--steps", type=int, default=300, help="tokens decoded per run (>= 2)")
    ap.add_argument("--window", type=int, default=16, help="replay window L")
    ap.add_argument("--drafts", type=int, default=4, help="most prompt-lookup drafts per verify")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=None,
                    help="also decode this many prompts at once (default: 64 on cuda, none on cpu)")
    ap.add_argument("--plot", type=Path, default=None,
                    help="PNG path (default: build/demo-<device>.png under the working directory)")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error(f"--steps: expected >= 2, got {args.steps}")
    if args.drafts < 1:
        ap.error(f"--drafts: expected >= 1, got {args.drafts}")
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        ap.error(f"--device: {e}")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    batch = args.batch if args.batch is not None else (64 if device.type == "cuda" else 1)
    if batch < 1:
        ap.error(f"--batch: expected >= 1, got {batch}")

    import transformers
    from tqdm import tqdm

    transformers.logging.set_verbosity_error()  # the CPU fallback notices of the modeling code
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny matrices: threads only contend for the cores
    plot_path = args.plot or Path("build") / f"demo-{device.type}.png"
    rows = []
    modes = 3 + len(READ_FORMATS) + (2 if batch > 1 else 0)
    t0 = time.perf_counter()
    with tqdm(total=len(MODELS) * modes * args.steps, unit="tok", desc="decoding") as bar:
        for name in MODELS:
            bar.set_postfix_str(name)
            rows += run_family(name, steps=args.steps, window=args.window, drafts=args.drafts, device=args.device,
                               seed=args.seed, tick=bar.update, batch=batch)
    total = time.perf_counter() - t0
    batched = f" (and {batch} in the 'replay b={batch}' rows)" if batch > 1 else ""
    print(f"{args.steps} greedy tokens per run after a {PROMPT_LEN}-token prompt, batch 1{batched}, fp32 models, "
          f"{device.type}, replayssm backend {rows[1]['backend']}; total {total:.1f} s")
    print(format_table(rows, args.steps))
    plot(rows, plot_path, f"replayssm on transformers' hybrid models, {device.type}, window {args.window}")
    print(f"plot: {plot_path}")
