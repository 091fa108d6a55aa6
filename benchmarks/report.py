"""Turn a bench_decode.py JSON (and decode_step.py JSONs) into the BENCHMARKS.md tables and PNG plots.

    python benchmarks/report.py benchmarks/results/bench-decode-h200.json --png benchmarks/results/decode-h200.png \
        --bars benchmarks/results/decode-h200-b256.png \
        --steps benchmarks/results/decode-step-h200.json benchmarks/results/decode-step-h200-staggered.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

PEER = {"nemotron-h": "peer mamba_ssm selective_state_update", "qwen3.5": "peer fla fused_recurrent T=1",
        "qwen3.5-122b": "peer fla fused_recurrent T=1", "kimi-linear": "peer fla fused_recurrent_kda T=1"}


def by_model_batch(rows):
    """``{(model, batch): {what: row}}`` of a bench_decode.py run's rows."""
    t = defaultdict(dict)
    for r in rows:
        t[(r["model"], r["batch"])][r["what"]] = r
    return t


def load(path):
    data = json.load(open(path))
    return data, by_model_batch(data["rows"])


def sglang_amortized(m):
    """SGLang replay over a window: mean of its non-flush points (w = 0, 7, 14) times 15, plus one flush."""
    nf = [m[f"peer sglang replay w={w}"]["us"] for w in (0, 7, 14) if f"peer sglang replay w={w}" in m]
    if not nf or "peer sglang replay flush" not in m:
        return None
    return (15 * sum(nf) / len(nf) + m["peer sglang replay flush"]["us"]) / 16


def decode_table(t, copy_gbps):
    rows = ["| model | batch | non-flush µs (w=0/7/14) | flush µs | amortized µs | GB/s (amortized) | % of copy | "
            "conventional peer µs | vs peer | SGLang replay amortized µs | vs SGLang | read floor µs | rw floor µs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, batch), m in sorted(t.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if model == "copy" or "ours amortized (16-step window)" not in m:
            continue
        nf = "/".join(f"{m[f'ours non-flush w={w}']['us']:.0f}" for w in (0, 7, 14))
        am = m["ours amortized (16-step window)"]
        peer = m.get(PEER[model])
        sg = sglang_amortized(m)
        rows.append(
            f"| {model} | {batch} | {nf} | {m['ours flush']['us']:.0f} | {am['us']:.0f} | {am['gbps']:.0f} | "
            f"{100 * am['gbps'] / copy_gbps:.0f}% | {peer['us']:.0f} | {peer['us'] / am['us']:.2f}x | "
            + (f"{sg:.0f} | {sg / am['us']:.2f}x" if sg else "– | –")
            + f" | {m['floor read']['us']:.0f} | {m['floor read+write']['us']:.0f} |")
    return "\n".join(rows)


def read_format_table(t):
    rows = ["| model | batch | non-flush w=7 fp32 µs | fp8 µs | nvfp4 µs | nvfp4 speedup | flush fp32 / fp8 / nvfp4 µs | "
            "amortized fp32 / fp8 / nvfp4 µs |",
            "|---|---|---|---|---|---|---|---|"]
    for (model, batch), m in sorted(t.items()):
        if "ours non-flush w=7 nvfp4" not in m:
            continue
        f32, f8, f4 = (m[k]["us"] for k in ("ours non-flush w=7", "ours non-flush w=7 fp8", "ours non-flush w=7 nvfp4"))
        fl = " / ".join(f"{m[k]['us']:.0f}" for k in ("ours flush", "ours flush fp8", "ours flush nvfp4"))
        am = " / ".join(f"{u:.1f}" for u in (m["ours amortized (16-step window)"]["us"], _amortized(m, "fp8"),
                                              _amortized(m, "nvfp4")))
        rows.append(f"| {model} | {batch} | {f32:.0f} | {f8:.0f} | {f4:.0f} | {f32 / f4:.2f}x | {fl} | {am} |")
    return "\n".join(rows)


def layout_table(t):
    """GDN / KDA amortized steps with the checkpoint in the pool's [slots, HV, K, V] layout (kv) and in a
    framework's [slots, HV, V, K] (vk), as the SGLang and TRT-LLM adapters bind it, per read format, with
    SGLang's replay kernel."""
    rows = ["| model | batch | checkpoint µs (kv / vk) | fp8 µs (kv / vk) | NVFP4 µs (kv / vk) | "
            "vk / kv (checkpoint, fp8, NVFP4) | SGLang replay µs | vk vs SGLang (fp32 / NVFP4) |",
            "|---|---|---|---|---|---|---|---|"]
    window = "ours amortized (16-step window"
    for (model, batch), m in sorted(t.items()):
        if f"{window}, vk state)" not in m:
            continue
        kv = [m[f"{window}){s}"]["us"] for s in ("", " fp8", " nvfp4")]
        vk = [m[f"{window}, vk state){s}"]["us"] for s in ("", " fp8", " nvfp4")]
        sg = sglang_amortized(m)
        rows.append(f"| {model} | {batch} | " + " | ".join(f"{a:.1f} / {b:.1f}" for a, b in zip(kv, vk))
                    + " | " + ", ".join(f"{b / a:.2f}" for a, b in zip(kv, vk)) + " | "
                    + (f"{sg:.1f} | {sg / vk[0]:.2f}x / {sg / vk[2]:.2f}x |" if sg else "– | – |"))
    return "\n".join(rows)


def hosts_glance_table(t, batch=256):
    """GDN / KDA at ``batch`` in the hosts' [slots, HV, V, K] layout (vk), what the SGLang and TRT-LLM
    adapters' users get: amortized steps on the fp32 checkpoint and behind an NVFP4 read copy, against
    fla's conventional kernel and SGLang's replay kernel (amortized and staggered), and the NVFP4
    non-flush step against the fp32 one."""
    names = {"qwen3.5": "Qwen3.5 (GDN)", "qwen3.5-122b": "Qwen3.5-122B (GDN)", "kimi-linear": "Kimi-Linear (KDA)"}
    rows = ["| model | amortized µs: fp32 checkpoint / NVFP4 read copy | fp32 vs fla | vs SGLang's replay, fp32: "
            "amortized / staggered | vs SGLang's replay, NVFP4: amortized / staggered | NVFP4 non-flush vs fp32 |",
            "|---|---|---|---|---|---|"]
    for model in names:
        m = t.get((model, batch), {})
        if "ours amortized (16-step window, vk state)" not in m:
            continue
        f32, f4 = (m[f"ours amortized (16-step window, vk state){s}"]["us"] for s in ("", " nvfp4"))
        st32, st4 = (m[f"ours staggered step{s} (vk state)"]["us"] for s in ("", " nvfp4"))
        nf32, nf4 = (m[f"ours non-flush w=7{s} (vk state)"]["us"] for s in ("", " nvfp4"))
        fla = m[PEER[model]]["us"]
        sg, sg_st = sglang_amortized(m), m["peer sglang replay staggered (1/16 of rows flush)"]["us"]
        rows.append(f"| {names[model]} | {f32:.1f} / {f4:.1f} | {fla / f32:.2f}x ({fla:.1f}) | "
                    f"{sg / f32:.2f}x / {sg_st / st32:.2f}x | {sg / f4:.2f}x / {sg_st / st4:.2f}x | {nf32 / nf4:.2f}x |")
    return "\n".join(rows)


def staggered_table(t):
    """The serving steady state: one step with 1/16 of the rows flushing (row r at r mod 16 entries)."""
    rows = ["| model | batch | ours fp32 µs | ours fp8 µs | ours nvfp4 µs | SGLang replay µs | vs SGLang (fp32) |",
            "|---|---|---|---|---|---|---|"]
    for (model, batch), m in sorted(t.items()):
        k = "ours staggered step (1/16 of rows flush)"
        if k not in m:
            continue
        us = [m[kk]["us"] if kk in m else None for kk in (k, "ours staggered step fp8", "ours staggered step nvfp4")]
        sg = m.get("peer sglang replay staggered (1/16 of rows flush)")
        rows.append(f"| {model} | {batch} | " + " | ".join(f"{u:.0f}" if u else "–" for u in us) + " | "
                    + (f"{sg['us']:.0f} | {sg['us'] / us[0]:.2f}x |" if sg else "– | – |"))
    return "\n".join(rows)


def verify_table(t):
    rows = ["| model | batch | T | ours verify µs | ours non-flush w=7 µs | verify / non-flush | snapshot baseline µs | "
            "vs baseline |", "|---|---|---|---|---|---|---|---|"]
    for (model, batch), m in sorted(t.items()):
        for T in (2, 4, 8):
            k = f"ours verify T={T} (no flush)"
            if k not in m or "ours non-flush w=7" not in m:   # a verify timed at a batch without decode rows
                continue
            base = next((v for kk, v in m.items() if kk.startswith(("baseline mamba2 per-draft snapshots",
                                                                     "peer fla kda per-draft snapshots"))
                         and kk.endswith(f"T={T}")), None)
            nf = m["ours non-flush w=7"]["us"]
            rows.append(f"| {model} | {batch} | {T} | {m[k]['us']:.0f} | {nf:.0f} | {m[k]['us'] / nf:.1f}x | "
                        + (f"{base['us']:.0f} | {base['us'] / m[k]['us']:.2f}x |" if base else "– | – |"))
    return "\n".join(rows)


def _amortized(m, fmt):
    """(15 x non-flush w=7 + flush) / 16 behind a read copy, or None."""
    nf, fl = m.get(f"ours non-flush w=7 {fmt}"), m.get(f"ours flush {fmt}")
    return (15 * nf["us"] + fl["us"]) / 16 if nf and fl else None


def verify_t8_table(t):
    """T = 8: half the rows flushing (row r at r mod 16 entries), and the query forms the adapters pass."""
    rows = ["| model | batch | no flush µs | half the rows flush µs | snapshot baseline µs | vs baseline (no flush / half) | "
            "q fp32 µs | q bf16 + q_scale µs |", "|---|---|---|---|---|---|---|---|"]
    for (model, batch), m in sorted(t.items()):
        k = "ours verify T=8 (no flush)"
        if k not in m or "ours verify T=8 (half the rows flush)" not in m:
            continue
        base = next((v["us"] for kk, v in m.items() if kk.startswith(("baseline mamba2 per-draft snapshots",
                                                                       "peer fla kda per-draft snapshots"))
                     and kk.endswith("T=8")), None)
        nf, half = m[k]["us"], m["ours verify T=8 (half the rows flush)"]["us"]
        q32, qs = (m.get(f"ours verify T=8 (no flush, {q})", {}).get("us")
                   for q in ("q fp32 as the adapters pass it", "q bf16 + q_scale"))
        rows.append(f"| {model} | {batch} | {nf:.1f} | {half:.1f} | " + (f"{base:.1f} | {base / nf:.2f}x / {base / half:.2f}x | "
                    if base else "– | – | ") + " | ".join(f"{u:.1f}" if u else "–" for u in (q32, qs)) + " |")
    return "\n".join(rows)


def step_table(paths):
    """decode_step.py JSONs: amortized µs per step of a layer stack, the SSM layers' share and the speedup."""
    rows = ["| stack | batch | cursors | variant | amortized µs | SSM share | speedup |", "|---|---|---|---|---|---|---|"]
    for path in paths:
        for r in json.load(open(path))["rows"]:
            rows.append(f"| {r['stack']} | {r['batch']} | {r['cursors']} | {r['variant']} | {r['amortized_us']:.1f} | "
                        f"{100 * r['ssm_share']:.0f} % | {r['speedup']:.2f}x |")
    return "\n".join(rows)


def plot_batch(t, batch, path, title):
    """Grouped bars at one batch: each model's step under every variant and peer, floors as lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = [mm for mm in ("nemotron-h", "qwen3.5", "qwen3.5-122b", "kimi-linear") if (mm, batch) in t]
    variants = {
        "conventional peer (mamba_ssm / fla)": lambda m, mm: m[PEER[mm]]["us"],
        "SGLang replay, amortized": lambda m, mm: sglang_amortized(m),
        "SGLang replay, staggered": lambda m, mm: m.get("peer sglang replay staggered (1/16 of rows flush)",
                                                        {}).get("us"),
        "replayssm fp32, amortized": lambda m, mm: m["ours amortized (16-step window)"]["us"],
        "replayssm fp32, staggered": lambda m, mm: m["ours staggered step (1/16 of rows flush)"]["us"],
        "replayssm + fp8 copy, amortized": lambda m, mm: _amortized(m, "fp8"),
        "replayssm + NVFP4 copy, amortized": lambda m, mm: _amortized(m, "nvfp4"),
        "replayssm + NVFP4 copy, staggered": lambda m, mm: m["ours staggered step nvfp4"]["us"],
    }
    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.8 / len(variants)
    for j, (name, get) in enumerate(variants.items()):
        ys = [get(t[(mm, batch)], mm) or 0.0 for mm in models]
        ax.bar([i + (j - len(variants) / 2 + 0.5) * width for i in range(len(models))], ys, width, label=name)
    for i, mm in enumerate(models):
        for key, style in (("floor read", ":"), ("floor read+write", "--")):
            ax.hlines(t[(mm, batch)][key]["us"], i - 0.42, i + 0.42, colors="k", linestyles=style, linewidth=1,
                      label=f"{key} of the fp32 state" if i == 0 else None)
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("µs per decode step (one layer)")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(t, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = ["nemotron-h", "qwen3.5", "qwen3.5-122b", "kimi-linear"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for ax, model in zip(axes, models):
        batches = sorted(b for (mm, b) in t if mm == model and "ours amortized (16-step window)" in t[(mm, b)])
        series = {
            "replayssm amortized": [t[(model, b)]["ours amortized (16-step window)"]["us"] for b in batches],
            "conventional peer": [t[(model, b)][PEER[model]]["us"] for b in batches],
            "read floor": [t[(model, b)]["floor read"]["us"] for b in batches],
            "read+write floor": [t[(model, b)]["floor read+write"]["us"] for b in batches],
        }
        sg = [sglang_amortized(t[(model, b)]) for b in batches]
        if all(sg):
            series["SGLang replay amortized"] = sg
        for name, ys in series.items():
            ax.plot(batches, ys, marker="o", label=name, linestyle="--" if "floor" in name else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("batch")
        ax.set_ylabel("µs per decode step (one layer)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle("Decode step per layer on an H200 (window 16, fp32 checkpoint, bf16 activations)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--png", default=None)
    ap.add_argument("--bars", default=None, metavar="PNG",
                    help="grouped bars at the JSON's batch 256 (or its only batch)")
    ap.add_argument("--steps", nargs="*", default=None, metavar="JSON", help="decode_step.py JSONs to tabulate")
    ap.add_argument("--title", default="Decode step per layer on an H200 (window 16, bf16 activations)")
    args = ap.parse_args()
    data, t = load(args.json)
    copy = t[("copy", 0)]["device copy 1 GiB, no graph"]["gbps"]
    print(f"GPU {data['gpu']}, torch {data['torch']}, Triton {data['triton']}; copy ceiling {copy:.0f} GB/s\n")
    print(decode_table(t, copy), "\n")
    print(read_format_table(t), "\n")
    print(staggered_table(t), "\n")
    print(verify_table(t), "\n")
    print(verify_t8_table(t), "\n")
    print(layout_table(t))
    if any(k[1] == 256 and "ours amortized (16-step window, vk state)" in m for k, m in t.items()):
        print("\n" + hosts_glance_table(t))
    if args.steps:
        print("\n" + step_table(args.steps))
    if args.png:
        plot(t, args.png)
    if args.bars:
        batches = sorted({b for (mm, b) in t if mm != "copy"})
        plot_batch(t, 256 if 256 in batches else batches[0], args.bars, args.title)


if __name__ == "__main__":
    main()
