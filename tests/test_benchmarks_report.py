"""BENCHMARKS.md's layer tables are what benchmarks/report.py prints from the raw results it cites, and its
serving tables in both orders what bench_serving computes from theirs."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "server"))
import bench_serving  # noqa: E402
import report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def tables():
    _, t = report.load(RESULTS / "bench-decode-h200.json")
    copy = t[("copy", 0)]["device copy 1 GiB, no graph"]["gbps"]
    _, vk = report.load(RESULTS / "bench-decode-vk-h200.json")   # both layouts, every read format
    return {"every batch": report.decode_table(t, copy), "steady state": report.staggered_table(t),
            "read copies": report.read_format_table(t), "state layout": report.layout_table(vk),
            "hosts' layout at a glance": report.hosts_glance_table(vk), "verify T = 8": report.verify_t8_table(t)}


@pytest.mark.parametrize("name", ["every batch", "steady state", "read copies", "state layout",
                                  "hosts' layout at a glance", "verify T = 8"])
def test_table_is_in_the_report(tables, name):
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    missing = [row for row in tables[name].splitlines() if row not in text]
    assert not missing, f"BENCHMARKS.md lacks rows of report.py's {name} table: {missing[:3]}"


def test_step_table_reads_the_layer_stacks():
    rows = report.step_table([RESULTS / "decode-step-h200.json", RESULTS / "decode-step-h200-staggered.json"])
    assert "| nemotron-h-8b | 256 | window | replay + nvfp4 | 22245.6 | 23 % | 1.51x |" in rows
    assert "| qwen3.5-9b | 256 | staggered | replay + nvfp4 | 27050.0 | 14 % | 1.11x |" in rows


def test_memory_rows_are_what_the_pools_allocate():
    """``benchmarks/memory.py``: replay's bytes per request and layer are a pool's ring, cursor and
    read-copy buffers per slot; SGLang's snapshots are T states (its ``intermediate_ssm`` layout,
    which ``ReplayMambaPool`` requires to skip)."""
    import memory

    import replayssm as rs
    from shapes import MODEL_SPECS

    rows = {(r["model"], r["tokens"]): r for r in memory.rows([4], window=16)}
    for name, spec in MODEL_SPECS.items():
        cfg = rs.ReplayConfig(window=16, max_draft_tokens=3, read_format="nvfp4", ring_dtype="bfloat16")
        pool = rs.StatePool(spec, cfg, num_layers=2, num_slots=3, device="meta", backend="reference")
        side = sum(t.numel() * t.element_size() for t in (*pool.read.values(), *pool.ring.values()))
        side += sum(c[:, :-1].numel() * c.element_size() for c in pool.cursors.values())
        row = rows[name, 4]
        assert row["replay_nvfp4"] == side // (2 * 3), name
        assert row["sglang_snapshots"] == 4 * row["state"] == 4 * spec.state_numel * 4, name


def test_benchmarks_md_memory_table_is_what_memory_py_prints():
    import memory

    assert memory.table(memory.rows([4, 8], window=16)) in (ROOT / "BENCHMARKS.md").read_text()


def test_bench_decode_summary_prices_sglang_as_the_tables_do(monkeypatch, capsys):
    """``bench_decode.py``'s summary (printed, and the JSON's ``summary``) prices SGLang's replay window as
    ``report.sglang_amortized`` does for BENCHMARKS.md's tables, from the same rows."""
    import bench_decode
    data, t = report.load(RESULTS / "bench-decode-vk-h200.json")
    summary = [{k: v for k, v in row.items() if k != "sglang_us"} for row in data["summary"]]
    monkeypatch.setattr(bench_decode, "RESULTS", data["rows"])
    monkeypatch.setattr(bench_decode, "SUMMARY", summary)
    bench_decode.print_summary()
    printed = capsys.readouterr().out
    assert len(summary) == 6
    for row in summary:
        want = report.sglang_amortized(t[(row["model"], row["batch"])])
        assert row["sglang_us"] == pytest.approx(want, abs=0.005)
        assert f"{row['sglang_us']:14.1f}" in printed
    qwen = next(r for r in summary if (r["model"], r["batch"]) == ("qwen3.5", 256))
    assert f"{qwen['sglang_us']:.1f}" == "169.7"                  # BENCHMARKS.md's hosts' layout table


def test_bench_decode_records_which_peers_it_loaded(tmp_path, monkeypatch):
    """A peers folder's fla package and SGLang file are loaded, and the JSON's ``peers`` names their
    files and fla's own ``__version__`` (not a version written by hand)."""
    import bench_decode
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        monkeypatch.delitem(sys.modules, name)
    (tmp_path / "fused_recurrent_linear_replayssm.py").write_text(
        "def fused_recurrent_linear_replayssm_decode(*a, **k):\n    return None\n")
    for pkg, body in [("fla", "__version__ = '0.0.7'\n"), ("fla/ops", ""),
                      ("fla/ops/gated_delta_rule", "def fused_recurrent_gated_delta_rule(*a, **k):\n    pass\n"),
                      ("fla/ops/kda", "")]:
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text(body)
    (tmp_path / "fla/ops/kda/fused_recurrent.py").write_text("def fused_recurrent_kda_fwd(*a, **k):\n    pass\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        peers = bench_decode.load_peers(str(tmp_path))
        sources = bench_decode.peer_sources(peers)
    finally:       # this folder's fla must not stay importable: transformers would take its kernels
        for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
            del sys.modules[name]
    assert sorted(peers) == ["fla_gdn", "fla_kda", "sglang"]          # no selective_state_update.py there
    assert sources["fla_gdn"] == dict(file=str(tmp_path / "fla/ops/gated_delta_rule/__init__.py"), version="0.0.7")
    assert sources["fla_kda"] == dict(file=str(tmp_path / "fla/ops/kda/fused_recurrent.py"), version="0.0.7")
    assert sources["sglang"] == dict(file=str(tmp_path / "fused_recurrent_linear_replayssm.py"))


def test_serving_tables_in_both_orders_are_what_their_results_give():
    """The both-orders serving tables in BENCHMARKS.md (decode loads of Qwen3.5 and Kimi-Linear, the
    shared-prefix load) hold the ratios ``bench_serving`` computes from the results files they cite."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    names = {"qwen3.5-9b": "Qwen3.5-9B", "kimi-linear-dense": "Kimi-Linear (dense)"}
    files = [RESULTS / "serving-qwen3.5-9b-orders-h100.json", RESULTS / "serving-kimi-linear-dense-orders-h100.json"]
    rows = [line.split(" | ") for line in bench_serving.both_orders_table(files).splitlines()[2:]]
    assert len(rows) == 4
    for cells in rows:
        model, load, output, decode, ttft = cells[0].strip("| "), cells[4], cells[5], cells[7], cells[9]
        decode_rounds = " / ".join(decode.split(" / ")[:2])
        row = f"| {names[model]} | {load} | {output} | {decode_rounds} | {ttft.rstrip(' |')} |"
        assert row in text, row

    # with the collector frozen: Qwen3.5 against SGLang, Kimi-Linear against SGLang's replay
    frozen = [RESULTS / "serving-qwen3.5-9b-frozen-orders-h100.json",
              RESULTS / "serving-kimi-linear-dense-frozen-orders-h100.json"]
    rows = [line.split(" | ") for line in bench_serving.both_orders_table(frozen).splitlines()[2:]]
    assert len(rows) == 3
    for cells in rows:
        model, load = cells[0].strip("| "), cells[4]
        against, output, decode = (("SGLang", cells[5], cells[7]) if cells[5] else
                                   ("SGLang's replay", cells[6], cells[8]))
        row = f"| {names[model]} | {against} | {load} | {output} | {decode} |"
        assert row in text, row

    data = json.loads((RESULTS / "serving-qwen3.5-9b-prefix-orders-h100.json").read_text())
    at = {(r["variant"], r["round"], r["load"]): r for r in data["rows"]}
    for rnd, first in ((1, "SGLang"), (2, "replay")):
        for load in (1, 2):
            s, r = at["sglang", rnd, load], at["replay-nvfp4", rnd, load]
            row = (f"| {rnd} ({first}) | {load} | {s['output_throughput']:.0f} / {r['output_throughput']:.0f} "
                   f"({r['output_throughput'] / s['output_throughput']:.2f}x) | {s['median_ttft_ms']:.0f} / "
                   f"{r['median_ttft_ms']:.0f} ({r['median_ttft_ms'] / s['median_ttft_ms']:.2f}x) | "
                   f"{r['p99_ttft_ms'] / s['p99_ttft_ms']:.2f}x | {s['cache_hit_rate_pct']:.1f} / "
                   f"{r['cache_hit_rate_pct']:.1f} % |")
            assert row in text, row
