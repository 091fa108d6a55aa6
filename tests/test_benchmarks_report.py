"""BENCHMARKS.md's layer tables are what benchmarks/report.py prints from the raw results it cites."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def tables():
    _, t = report.load(RESULTS / "bench-decode-h200.json")
    copy = t[("copy", 0)]["device copy 1 GiB, no graph"]["gbps"]
    return {"every batch": report.decode_table(t, copy), "steady state": report.staggered_table(t),
            "read copies": report.read_format_table(t), "state layout": report.layout_table(t),
            "verify T = 8": report.verify_t8_table(t)}


@pytest.mark.parametrize("name", ["every batch", "steady state", "read copies", "state layout", "verify T = 8"])
def test_table_is_in_the_report(tables, name):
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    missing = [row for row in tables[name].splitlines() if row not in text]
    assert not missing, f"BENCHMARKS.md lacks rows of report.py's {name} table: {missing[:3]}"


def test_step_table_reads_the_layer_stacks():
    rows = report.step_table([RESULTS / "decode-step-h200.json", RESULTS / "decode-step-h200-staggered.json"])
    assert "| nemotron-h-8b | 256 | window | replay + nvfp4 | 22245.6 | 23 % | 1.51x |" in rows
    assert "| qwen3.5-9b | 256 | staggered | replay + nvfp4 | 27050.0 | 14 % | 1.11x |" in rows
