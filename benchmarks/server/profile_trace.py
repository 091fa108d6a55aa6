"""Where a served decode step spends its GPU time: a summary of the kernels in a torch profiler trace
that SGLang's server wrote (``POST /start_profile`` with ``activities=["GPU"]``, see
``bench_serving.py --profile-steps``).

    python benchmarks/server/profile_trace.py TRACE.json[.gz] --steps N [--json OUT]
    python benchmarks/server/profile_trace.py --plot OUT.png serving-<model>.json ...

Every kernel event of the trace (CUDA-graph replays included: CUPTI records each kernel node) is put
in one of ``GROUPS`` by its name; the summary gives per decode step (the trace's kernel time divided
by ``--steps``) each group's time and launch count, the GPU's busy time (the union of the kernels'
intervals) and the span from the first kernel's start to the last one's end, and the kernels of the
most time. A trace recorded with CPU activity and stacks (``bench_serving.py --profile-host``) also
gets ``summarize_host``: the host time of replayssm's own work, of SGLang's scheduler stages,
and of the runtime calls that wait for the device, by the Python frame that made them. ``--plot``
draws the profiled rows of ``bench_serving.py``'s files: kernel time per step by group beside the
step's wall span.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import re

# (group, pattern on the kernel name), first match wins
GROUPS = [
    ("replayssm", re.compile(r"^_(delta|mamba2)_|_refresh_read_copy|_store_checkpoint|^_(advance|commit|copy_slots)_")),
    ("sglang ssm", re.compile(r"recurrent|replayssm|gated_delta|kda|selective_(state|scan)|ssd_|chunk_|mamba")),
    ("conv1d", re.compile(r"conv1d|causal_conv")),
    ("attention", re.compile(r"attn|attention|flash|_fwd_kernel|decode_kernel|mla")),
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|cublas|matmul|sm90_|wgmma")),
    ("norm", re.compile(r"norm", re.I)),
    ("moe", re.compile(r"moe|topk|expert", re.I)),
    ("sampling", re.compile(r"sort|argmax|softmax|sampl|radix", re.I)),
    ("pytorch elementwise / reduce", re.compile(r"elementwise|reduce_kernel|vectorized|unrolled|index|cat|copy|fill",
                                                re.I)),
]


def group_of(name: str) -> str:
    """The group of a kernel name (``other`` when no pattern matches)."""
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "other"


def kernels(trace: dict) -> list[dict]:
    """The trace's kernel events (``cat`` kernel, with a duration)."""
    return [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]


def busy_us(events: list[dict]) -> float:
    """Microseconds in which at least one kernel ran (the union of ``[ts, ts + dur]``)."""
    total, end = 0.0, None
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def summarize(trace: dict, steps: int, top: int = 30) -> dict:
    """Per-step kernel time by group and the ``top`` kernels of the most time (see the module)."""
    if steps < 1:
        raise ValueError(f"steps: expected a positive count of profiled steps, got {steps}")
    ev = kernels(trace)
    if not ev:
        raise ValueError("trace: no kernel events (was the profile started with activities=['GPU']?)")
    by_group: dict[str, list[float]] = {}
    by_name: dict[str, list[float]] = {}
    for e in ev:
        for table, key in ((by_group, group_of(e["name"])), (by_name, e["name"])):
            slot = table.setdefault(key, [0.0, 0])
            slot[0] += e["dur"]
            slot[1] += 1
    span = max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)
    kernel_us = sum(e["dur"] for e in ev)
    return dict(
        steps=steps, kernels=len(ev),
        per_step=dict(kernel_us=kernel_us / steps, busy_us=busy_us(ev) / steps, span_us=span / steps,
                      launches=len(ev) / steps),
        groups={g: dict(us=t / steps, launches=c / steps, share=t / kernel_us)
                for g, (t, c) in sorted(by_group.items(), key=lambda kv: -kv[1][0])},
        top=[dict(name=n[:160], group=group_of(n), us=t / steps, launches=c / steps)
             for n, (t, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]])


# SGLang's scheduler stages: python functions whose outermost calls ``summarize_host`` times
STAGES = ("recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch", "process_batch_result")
# runtime calls that block the host until the device has finished the work queued before them
SYNCS = re.compile(r"^cuda(Stream|Device|Event)Synchronize$")
_REPLAYSSM = re.compile(r"(^|/)replayssm/")
_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")


def has_python_frames(trace: dict) -> bool:
    """Whether ``trace`` holds the Python tracer's frames (a profile with CPU activity and stacks)."""
    return any(e.get("cat") == "python_function" for e in trace.get("traceEvents", []))


def summarize_host(trace: dict, steps: int, top: int = 20) -> dict:
    """Where the profiled process's host threads spent their time, per profiled step, from the
    Python frames of a trace recorded with CPU activity and stacks (``/start_profile`` with
    ``activities=["CPU", "GPU"]`` and ``with_stack``; the Python tracer's own cost is included):

    - ``replayssm``: the time of replayssm's own work, per replayssm function (``"file: func"``): a
      frame's time less its callees' (none below zero; a frame that overruns the frame it starts in
      is not its callee), charged to the innermost replayssm frame above it (torch,
      Triton's launches and other libraries included), up to SGLang's code, whose calls (the
      original method around which a hook runs) are not replayssm's;
    - ``stages``: the outermost calls of SGLang's scheduler stages (``STAGES``), inclusive;
    - ``syncs``: the runtime calls that wait for the device (``SYNCS``), per innermost Python frame
      outside torch that issued them (``"file(line): func"``): a wait on the host of the overlap
      scheduler stalls its next batch's preparation.
    """
    if steps < 1:
        raise ValueError(f"steps: expected a positive count of profiled steps, got {steps}")
    if not has_python_frames(trace):
        raise ValueError("trace: no python_function events (was the profile started with CPU activity and with_stack?)")
    events = [e for e in trace["traceEvents"] if "dur" in e and (
        e.get("cat") == "python_function" or (e.get("cat") == "cuda_runtime" and SYNCS.match(e.get("name", ""))))]
    replay: dict[str, list[float]] = {}
    stages: dict[str, float] = {}
    syncs: dict[str, list[float]] = {}
    by_thread: dict[tuple, list[dict]] = {}
    for e in events:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for thread in by_thread.values():
        stack: list[list] = []          # the enclosing frames: [end, name, owner, callees' time]
        owned: list[list] = []          # [frame's time, its stack entry] of the frames replayssm owns
        for e in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            # the enclosing frames are those that contain the event (the tracer's frames cut at the
            # profile's start or stop, or resumed generators, need not nest)
            while stack and (stack[-1][0] <= e["ts"] or stack[-1][0] < e["ts"] + e["dur"] - 1e-3):
                stack.pop()
            if e["cat"] == "cuda_runtime":
                caller = next((name for _, name, _, _ in reversed(stack) if not name.startswith(("torch/", "<"))),
                              "(no Python frame)")
                slot = syncs.setdefault(caller, [0.0, 0])
                slot[0] += e["dur"]
                slot[1] += 1
                continue
            m = _FRAME.match(e["name"])
            if m and _REPLAYSSM.search(m["file"]):
                owner = f"{m['file']}: {m['func']}"
                replay.setdefault(owner, [0.0, 0])[1] += 1
            elif m and "sglang/" in m["file"]:
                owner = None
            else:
                owner = stack[-1][2] if stack else None
            if m and m["func"] in STAGES and "sglang/" in m["file"] and not any(
                    name.endswith(f": {m['func']}") for _, name, _, _ in stack):
                stages[m["func"]] = stages.get(m["func"], 0.0) + e["dur"]
            if stack:
                stack[-1][3] += e["dur"]
            entry = [e["ts"] + e["dur"], e["name"], owner, 0.0]
            stack.append(entry)
            if owner is not None:
                owned.append([e["dur"], entry])
        for dur, (_, _, owner, callees) in owned:
            replay[owner][0] += max(0.0, dur - callees)      # callees that overlap one another: none of its own
    return dict(
        steps=steps,
        per_step=dict(replayssm_us=sum(t for t, _ in replay.values()) / steps,
                      sync_us=sum(t for t, _ in syncs.values()) / steps,
                      syncs=sum(c for _, c in syncs.values()) / steps),
        stages={g: stages[g] / steps for g in STAGES if g in stages},
        replayssm=[dict(name=n, us=t / steps, calls=c / steps)
                   for n, (t, c) in sorted(replay.items(), key=lambda kv: -kv[1][0])[:top]],
        syncs=[dict(at=n, us=t / steps, count=c / steps)
               for n, (t, c) in sorted(syncs.items(), key=lambda kv: -kv[1][0])[:top]])


def regroup(profile: dict) -> dict:
    """``profile`` (a ``summarize`` result) with its ``top`` kernels moved to the group ``GROUPS`` gives
    them now, for summaries written before a pattern changed; kernels past ``top`` keep their group."""
    groups = {g: dict(v) for g, v in profile["groups"].items()}
    top = []
    for k in profile["top"]:
        now = group_of(k["name"])
        if now != k["group"]:
            for g, sign in ((k["group"], -1.0), (now, 1.0)):
                slot = groups.setdefault(g, dict(us=0.0, launches=0.0, share=0.0))
                slot["us"] += sign * k["us"]
                slot["launches"] += sign * k["launches"]
        top.append(dict(k, group=now))
    kernel_us = profile["per_step"]["kernel_us"]
    groups = {g: dict(v, share=v["us"] / kernel_us) for g, v in sorted(groups.items(), key=lambda kv: -kv[1]["us"])
              if v["launches"] > 1e-9}
    return dict(profile, groups=groups, top=top)


def profiled_rows(paths: list[pathlib.Path]) -> list[tuple[str, dict]]:
    """``(label, row)`` for every row with a ``profile`` in these ``serving-<model>[-<run>].json`` files
    (label: the model, the run from the file's name, the variant and the concurrency), the profile
    regrouped (``regroup``)."""
    found = []
    for path in paths:
        data = json.loads(path.read_text())
        run = path.stem.removeprefix(f"serving-{data['model']}").strip("-")
        for r in data["rows"]:
            if "profile" in r:
                at = f", {r['concurrency']} running" if "concurrency" in r else ""
                found.append((f"{r['model']}\n{run}\n{r['variant']}{at}", dict(r, profile=regroup(r["profile"]))))
    if not found:
        raise ValueError(f"paths: no profiled row in {[str(p) for p in paths]} (run bench_serving with --profile-steps)")
    return found


def plot(paths: list[pathlib.Path], out: pathlib.Path) -> None:
    """A bar per profiled row: its kernels' time per decode step stacked by group, and the step's wall
    span (the profiled stretch's time per step) as a marker, the gap being the GPU's idle time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = profiled_rows(paths)
    groups = [g for g, _ in GROUPS] + ["other"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows)), 5))
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for g in groups:
        h = [r["profile"]["groups"].get(g, {}).get("us", 0.0) / 1000 for _, r in rows]
        if any(h):
            ax.bar(x, h, bottom=bottom, label=g)
            bottom = [b + v for b, v in zip(bottom, h)]
    ax.plot(x, [r["profile"]["per_step"]["span_us"] / 1000 for _, r in rows], "k_", markersize=28,
            label="step span (wall)")
    ax.set_xticks(list(x), [label for label, _ in rows], fontsize=6)
    ax.set_ylabel("ms per decode step")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def load(path: pathlib.Path) -> dict:
    """A chrome trace, gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", type=pathlib.Path, nargs="+",
                    help="a trace (with --steps), or serving-<model>.json files (with --plot)")
    ap.add_argument("--steps", type=int, help="forward steps the trace holds")
    ap.add_argument("--json", type=pathlib.Path, help="write the summary here as JSON")
    ap.add_argument("--plot", type=pathlib.Path, help="draw the profiled rows of the serving files to this PNG")
    args = ap.parse_args(argv)
    if args.plot:
        try:
            plot(args.inputs, args.plot)
        except ValueError as e:
            ap.error(str(e))
        return 0
    if args.steps is None or len(args.inputs) != 1:
        ap.error("expected one trace and --steps (or --plot with serving files)")
    args.trace = args.inputs[0]
    trace = load(args.trace)
    s = summarize(trace, args.steps)
    if has_python_frames(trace):
        s["host"] = summarize_host(trace, args.steps)
    if args.json:
        args.json.write_text(json.dumps(s, indent=1) + "\n")
    p = s["per_step"]
    print(f"per step: {p['kernel_us']:.0f} us of kernels, GPU busy {p['busy_us']:.0f} us, span {p['span_us']:.0f} us, "
          f"{p['launches']:.0f} launches")
    for g, v in s["groups"].items():
        print(f"  {g:32s} {v['us']:9.1f} us {v['launches']:7.1f} launches {100 * v['share']:5.1f} %")
    if "host" in s:
        h = s["host"]
        print(f"host per step: replayssm {h['per_step']['replayssm_us']:.0f} us, waits for the device "
              f"{h['per_step']['sync_us']:.0f} us ({h['per_step']['syncs']:.1f})")
        for stage, us in h["stages"].items():
            print(f"  {stage:32s} {us:9.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
