"""The README's quick start runs as written (CPU, reference backend) and prints what the README says."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    """The one ```python block of the README's "Quick start" section."""
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert section, "README.md: no '## Quick start' section"
    blocks = re.findall(r"^```python\n(.*?)^```", section.group(1), flags=re.S | re.M)
    assert len(blocks) == 1, f"README.md quick start: expected one python block, found {len(blocks)}"
    return blocks[0]


def test_quick_start_runs_as_written(capsys):
    code = quick_start()
    exec(compile(code, f"{README}:quick-start", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    output_err = float(re.search(r"output error behind NVFP4: ([0-9.e+-]+)", out).group(1))
    state_err = float(re.search(r"state error: ([0-9.e+-]+)", out).group(1))
    # the README: an output error of about 0.06 (the read copy's rounding), a state error below 1e-6
    assert 0.01 < output_err < 0.1, out
    assert state_err < 1e-6, out
