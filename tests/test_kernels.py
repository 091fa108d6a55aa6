"""Triton kernels == reference backend == fp64 step recurrence.

On a CPU the kernels run in Triton's interpreter on tiny shapes; on a GPU the same tests also
run at real model dims. Rings and cursors compare bit-exactly; outputs start NaN-poisoned.
"""

import re
import zlib

import pytest
import torch
import triton
import triton.language as tl

import replayssm as rs
from helpers import SPECS, TOL, Params, f64, make_inputs, rms_ratio, step_oracle, token
from shapes import MODEL_SPECS

from replayssm.kernels import ops, plan
from replayssm.kernels.gating.reference import gating_ref
from replayssm.kernels.formats.triton import (READ_CODES, dot_fp32, e2m1_encode, fp16_stochastic_round,
                                              load_read_words, word_values)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CASES = {f"tiny-{k}": v for k, v in SPECS.items()}
if CUDA:
    CASES.update({f"real-{k}": v for k, v in MODEL_SPECS.items()})

CONFIGS = {
    "L1": dict(window=1),
    "L4": dict(window=4),
    "L16-d7": dict(window=16, max_draft_tokens=7),
    "L17": dict(window=17),                       # a flush folds 16 entries: a full delta block
    "L4-d16": dict(window=4, max_draft_tokens=16),  # a ring of 34: delta blocks of 32, verify PADDED_T 16
    "L4-d3-fp8": dict(window=4, max_draft_tokens=3, read_format="fp8"),
    # T = 3: a verify with a padded token lane (PADDED_T 4); the d1 / d3 / d7 configs verify T = 2 to 8
    # at PADDED_T 2 to 8
    "L8-d2-nvfp4-fp16sr": dict(window=8, max_draft_tokens=2, read_format="nvfp4", checkpoint_dtype="float16_sr"),
    "L4-d1-bf16": dict(window=4, max_draft_tokens=1, checkpoint_dtype="bfloat16", ring_dtype="bfloat16"),
    "L8-bf16ring": dict(window=8, ring_dtype="bfloat16"),  # fp32 checkpoint, 16-bit ring: as the adapters run
    "L8-d3-bf16ring": dict(window=8, max_draft_tokens=3, ring_dtype="bfloat16"),  # verify on exact tf32 operands
}


class Twin:
    """The same inputs through a reference pool, a Triton pool and the fp64 step recurrence."""

    def __init__(self, spec, cfg, n, seed):
        self.spec, self.cfg, self.n = spec, cfg, n
        self.pools = {b: rs.StatePool(spec, cfg, num_layers=2, num_slots=n + 2, device=DEVICE, backend=b)
                      for b in ("reference", "triton")}
        self.slots = {b: p.alloc(n) for b, p in self.pools.items()}
        self.gen = torch.Generator().manual_seed(seed)
        self.params = Params(spec, 2, self.gen)
        self.state = [torch.zeros(n, *spec.state_shape, dtype=torch.float64, device=DEVICE) for _ in range(2)]

    def _out(self, T):
        spec = self.spec
        heads, dim = (spec.num_heads, spec.head_dim) if spec.family == "mamba2" else (spec.num_v_heads, spec.head_v_dim)
        shape = (self.n, heads, dim) if T is None else (self.n, T, heads, dim)
        return torch.full(shape, float("nan"), dtype=self.cfg.torch_ring_dtype, device=DEVICE)

    def step(self, layer, T=None, accepted=None):
        inp = make_inputs(self.spec, self.params, layer, self.n, T, self.gen, self.cfg.torch_ring_dtype, device=DEVICE)
        fn = rs.decode if T is None else rs.verify
        ys = {b: fn(p, layer, self.slots[b], out=self._out(T), **inp) for b, p in self.pools.items()}
        S = self.state[layer]
        if T is None:
            y_true, self.state[layer] = step_oracle(self.spec, S, f64(inp))
        else:
            outs = []
            new = S.clone()
            for t in range(T):
                yt, S = step_oracle(self.spec, S, f64(token(inp, t)))
                outs.append(yt)
                hit = (accepted == t + 1).to(DEVICE)
                new[hit] = S[hit]
            y_true, self.state[layer] = torch.stack(outs, 1), new
        return ys, y_true

    def commit(self, accepted):
        for b, p in self.pools.items():
            p.commit(self.slots[b], accepted)

    def assert_same_bits(self, d_tol):
        """Raw ring entries and cursors bit-exact; the delta families' d cache within ``d_tol``."""
        ref, tri = self.pools["reference"], self.pools["triton"]
        for name in ref.ring:
            if name == "d":
                assert rms_ratio(tri.ring["d"], ref.ring["d"]) < d_tol
            else:
                assert torch.equal(ref.ring[name], tri.ring[name]), f"ring {name} differs"
        for name in ref.cursors:
            assert torch.equal(ref.cursors[name], tri.cursors[name]), f"cursor {name} differs"
        if tri.read:
            # the read copy is always the encoding of the stored checkpoint, byte for byte
            ck = tri.checkpoint[:, self.slots["triton"]].float()
            if self.spec.is_delta:
                ck = ck.transpose(-1, -2)
            for name, want in zip(("codes", "block_scale", "row_scale"), rs.formats.quantize(ck, self.cfg.read_format)):
                got = tri.read[name][:, self.slots["triton"]]
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"read copy {name} differs"


def _pair_tol(cfg, decode_only=False):
    """Kernel vs reference outputs. Decodes read the same read-copy bytes in both, so they agree as
    closely as on the checkpoint; a verify behind a read copy does not (the reference re-solves the
    window's d where the kernel reads them from the d cache, both within the copy's rounding)."""
    if cfg.ring_dtype == "bfloat16":
        return 2e-2
    if cfg.read_format != "checkpoint" and not decode_only:
        return 5e-2
    return 2e-5 if cfg.checkpoint_dtype == "float32" else 1e-2


def test_delta_history_block_holds_every_entry_a_step_touches():
    """The delta kernels' entry block covers the longest committed history (RING.md: count <=
    max(L - 1, T_max)), a non-flushing decode's history and token, and a verify's tokens; it is
    never larger than the capacity's block."""
    for window in range(1, 70):
        for drafts in range(0, 40):
            cfg = rs.ReplayConfig(window=window, max_draft_tokens=drafts)
            history = max(window - 1, cfg.max_tokens)
            for T in range(1, cfg.max_tokens + 1):
                block = ops._history_block(cfg.capacity, window, T)
                assert block >= history and block >= window - 1 and block >= T and block & (block - 1) == 0
                assert block <= ops._window_block(cfg.capacity)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference_and_recurrence(case, config):
    spec = CASES[case]
    cfg = rs.ReplayConfig(**CONFIGS[config])
    n = 3 if case.startswith("tiny") else 8
    twin = Twin(spec, cfg, n, seed=zlib.crc32(f"{case}-{config}".encode()) % 2**16)
    tol_true = TOL[cfg.read_format] if cfg.read_format != "checkpoint" else TOL[cfg.checkpoint_dtype]
    if cfg.ring_dtype == "bfloat16":
        tol_true = max(tol_true, 2e-2)
    steps = 2 * cfg.window + 3
    errs = []
    for s in range(steps):
        if cfg.max_draft_tokens and s % 2:
            T = 1 + s % cfg.max_tokens
            acc = torch.randint(1, T + 1, (n,), generator=twin.gen)
        else:
            T, acc = None, None
        for layer in range(2):
            ys, y_true = twin.step(layer, T, acc)
            y_ref, y_tri = ys["reference"], ys["triton"]
            assert torch.isfinite(y_tri).all(), "kernel left outputs unwritten"
            errs.append(rms_ratio(y_tri, y_ref))
            assert errs[-1] < _pair_tol(cfg), (s, layer, errs[-1])
            assert rms_ratio(y_tri, y_true) < tol_true
        if acc is not None:
            twin.commit(acc)
        twin.assert_same_bits(_pair_tol(cfg))
    ref, tri = twin.pools["reference"], twin.pools["triton"]
    ck_tol = 1e-5 if cfg.checkpoint_dtype == "float32" else 2e-2
    assert rms_ratio(tri.checkpoint.float(), ref.checkpoint.float()) < ck_tol
    for layer in range(2):
        st = tri.read_state(layer, twin.slots["triton"])
        assert rms_ratio(st, twin.state[layer]) < max(ck_tol, TOL[cfg.checkpoint_dtype])


@pytest.mark.parametrize("read_format", ["checkpoint", "fp8"])
@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_single_token_verify(family, read_format):
    """A verify of one token (T = 1, not committed: a flush folds the history only and the token
    stays pending until the commit) beside decodes, across flushes: the decode launch's fold of a
    committed token must not take this path. Outputs and checkpoint as the reference and the step
    recurrence, rings and cursors bit-exact."""
    spec, cfg = SPECS[family], rs.ReplayConfig(window=3, max_draft_tokens=2, read_format=read_format)
    twin, tol = Twin(spec, cfg, 3, seed=5), TOL["float32" if read_format == "checkpoint" else read_format]
    for s in range(4 * cfg.window):
        T = 1 if s % 3 else None
        for layer in range(2):
            ys, y_true = twin.step(layer, T, torch.ones(3, dtype=torch.int64) if T else None)
            assert torch.isfinite(ys["triton"]).all()
            assert rms_ratio(ys["triton"], ys["reference"]) < _pair_tol(cfg), (s, layer)
            assert rms_ratio(ys["triton"], y_true) < tol, (s, layer)
        if T:
            twin.commit(torch.ones(3, dtype=torch.int64, device=DEVICE))
        twin.assert_same_bits(_pair_tol(cfg))
    for layer in range(2):
        assert rms_ratio(twin.pools["triton"].read_state(layer, twin.slots["triton"]), twin.state[layer]) < 1e-5


@pytest.mark.parametrize("fmt", [dict(), dict(read_format="fp8"), dict(read_format="nvfp4"),
                                 dict(checkpoint_dtype="bfloat16", read_format="nvfp4"),
                                 dict(checkpoint_dtype="float16_sr", read_format="fp8")],
                         ids=["fp32", "fp8", "nvfp4", "bf16-nvfp4", "fp16sr-fp8"])
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_store_checkpoint_is_bit_exact(family, fmt):
    """write_state through the kernel stores the same checkpoint and read-copy bytes as the reference."""
    spec = SPECS[family]
    cfg = rs.ReplayConfig(seed=11, **fmt)
    pools = {b: rs.StatePool(spec, cfg, num_layers=2, num_slots=4, device=DEVICE, backend=b)
             for b in ("reference", "triton")}
    gen = torch.Generator().manual_seed(5)
    state = (torch.randn(3, *spec.state_shape, generator=gen) * torch.logspace(-4, 3, spec.state_shape[-1])).to(DEVICE)
    for p in pools.values():
        slots = p.alloc(3)
        for _ in range(3):  # several epochs: fresh stochastic-rounding bits each time
            p.write_state(1, slots, state)
    ref, tri = pools["reference"], pools["triton"]
    assert torch.equal(ref.checkpoint.view(torch.uint8), tri.checkpoint.view(torch.uint8))
    for name in ref.read:
        assert torch.equal(ref.read[name].view(torch.uint8), tri.read[name].view(torch.uint8)), name
    assert torch.equal(ref.cursors["epoch"], tri.cursors["epoch"])


def test_a_bf16_checkpoint_keeps_nans_and_rounds_the_rest_as_torch():
    """The kernels' integer fp32 -> bf16 rounding: every finite value and infinity bit for bit as
    torch's, and a NaN of any payload (the GPU's own is 0x7FFFFFFF) stays a NaN, where the rounding
    carry would have made some of them zeros."""
    spec = SPECS["gdn"]
    cfg = rs.ReplayConfig(checkpoint_dtype="bfloat16")
    gen = torch.Generator().manual_seed(21)
    state = torch.randn(2, *spec.state_shape, generator=gen)
    special = torch.tensor([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800001, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
                            0x3F808000, 0x3F818000, 0x00000001], dtype=torch.int64).to(torch.int32).view(torch.float32)
    state.view(-1)[:special.numel()] = special
    pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=3, device=DEVICE, backend="triton")
    slots = pool.alloc(2)
    pool.write_state(0, slots, state.to(DEVICE))
    got = pool.checkpoint[0, slots].cpu()
    want = state.to(torch.bfloat16)
    nan = state.isnan()
    assert got[nan].isnan().all() and nan.sum() == 4
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.parametrize("fmt", [dict(read_format="fp8"), dict(read_format="nvfp4"),
                                 dict(checkpoint_dtype="bfloat16", read_format="nvfp4"),
                                 dict(checkpoint_dtype="float16_sr", read_format="fp8")],
                         ids=["fp8", "nvfp4", "bf16-nvfp4", "fp16sr-fp8"])
@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("rows_from_blocks", [None, "flipped"])
def test_refresh_read_copy_is_bit_exact(family, fmt, rows_from_blocks, monkeypatch):
    """A refresh after the host wrote checkpoints itself (a prefill): the kernel re-derives the same
    read-copy bytes as the reference, from a [S, HV, V, K] checkpoint too (the hosts' layout), for
    the refreshed slots only; the checkpoint is not written. Both ways of taking the row maxima
    (``REFRESH_TILES``' ``rows_from_blocks``, the tile in use and the other) write those bytes."""
    if rows_from_blocks:
        for along, tile in list(ops.REFRESH_TILES.items()):
            monkeypatch.setitem(ops.REFRESH_TILES, along, dict(tile, rows_from_blocks=along == "rows"))
    spec = SPECS[family]
    cfg = rs.ReplayConfig(seed=4, **fmt)
    S, layouts = 5, ["kv", "vk"] if spec.is_delta else ["kv"]
    gen = torch.Generator().manual_seed(8)
    state = (torch.randn(2, S, *spec.state_shape, generator=gen)
             * torch.logspace(-4, 3, spec.state_shape[-1])).to(cfg.torch_checkpoint_dtype)
    ref = rs.StatePool(spec, cfg, num_layers=2, num_slots=S, device=DEVICE, backend="reference")
    ref.checkpoint.copy_(state.to(DEVICE))
    ref.allocated.fill_(True)                            # the host owns the slots (as SGLang's allocator does)
    ref.refresh(torch.tensor([3, 0, 4], device=DEVICE), layer=1)
    for layout in layouts:
        # the pool takes a [S, HV, V, K] tensor as the host stores it
        ckpt = (state.transpose(-1, -2) if layout == "vk" else state).contiguous().to(DEVICE)
        tri = rs.StatePool(spec, cfg, num_layers=2, num_slots=S, device=DEVICE, backend="triton", checkpoint=ckpt,
                           state_layout=layout)
        for buf in tri.read.values():
            buf.view(torch.uint8).fill_(0xFF)
        before = ckpt.clone()
        tri.allocated.fill_(True)
        tri.refresh(torch.tensor([3, -1, 0, 4], device=DEVICE), layer=1, checked=False)
        assert torch.equal(ckpt.view(torch.uint8), before.view(torch.uint8)), layout
        for name, buf in tri.read.items():
            assert torch.equal(buf[1, [0, 3, 4]].view(torch.uint8), ref.read[name][1, [0, 3, 4]].view(torch.uint8)), \
                (layout, name)
            assert buf[1, [1, 2]].view(torch.uint8).eq(0xFF).all() and buf[0].view(torch.uint8).eq(0xFF).all(), \
                (layout, name)
        # the op itself skips any slot outside the pool, as the step kernels do (a host calling it directly)
        from replayssm.kernels.backend import layer_state
        buffers = layer_state(tri, 1)
        before = {name: buf.clone() for name, buf in tri.read.items()}
        ops.refresh_read_copy(checkpoint=buffers["checkpoint"], slots=torch.tensor([S, 99, -7], device=DEVICE),
                              read_codes=buffers["read_codes"], read_block_scale=buffers["read_block_scale"],
                              read_row_scale=buffers["read_row_scale"], is_delta=spec.is_delta,
                              read_format=READ_CODES[cfg.read_format])
        for name, buf in tri.read.items():
            assert torch.equal(buf.view(torch.uint8), before[name].view(torch.uint8)), (layout, name)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")      # the interpreter's reductions
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_nans_in_the_state_decode_as_nan_read_copy_rows(family, fmt):
    """A NaN in the checkpoint gives its read-copy row a NaN row scale, so the row decodes as NaNs and
    the outputs that read it are NaN, as the reference's encoding (``torch.amax``) gives, not finite
    values: through write_state, the decodes and their flushes (the window's steps), and a refresh.
    Every other row keeps the reference's bytes."""
    spec, cfg = SPECS[family], rs.ReplayConfig(window=3, read_format=fmt)
    gen = torch.Generator().manual_seed(13)
    params, n = Params(spec, 1, gen), 3
    pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=n + 1, device=DEVICE, backend="triton")
    slots = pool.alloc(n)
    state = torch.randn(n, *spec.state_shape, generator=gen)
    state[0, 1, 2, 3] = float("nan")                     # slot 0, head 1: one element
    state[2, 0, 0, 1] = float("nan")

    def read_rows_nan():
        ck = pool.checkpoint[0, slots].float()
        ck = ck.transpose(-1, -2) if spec.is_delta else ck              # the read copy's [rows, cols]
        nan = ck.isnan().any(-1)
        want = rs.formats.quantize(ck, fmt)
        got = [pool.read[name][0, slots] for name in ("codes", "block_scale", "row_scale")]
        assert torch.equal(got[2].isnan(), nan)
        for g, w in zip(got, want):
            assert torch.equal(g[~nan].view(torch.uint8), w[~nan].view(torch.uint8))
        return nan

    pool.write_state(0, slots, state.to(DEVICE))
    nan = read_rows_nan()
    assert nan.sum() == 2
    heads, dim = (spec.num_heads, spec.head_dim) if family == "mamba2" else (spec.num_v_heads, spec.head_v_dim)
    for step in range(2 * cfg.window + 1):
        inp = make_inputs(spec, params, 0, n, None, gen, device=DEVICE)
        y = rs.decode(pool, 0, slots, out=torch.full((n, heads, dim), float("nan"), device=DEVICE), **inp)
        assert torch.equal(y.isnan(), nan), step
        nan = read_rows_nan()                        # the delta rule spreads a NaN over its value row only
    pool.read["row_scale"].zero_()
    pool.refresh(slots, layer=0)
    assert torch.equal(read_rows_nan(), nan)


@triton.jit
def _decode_words_kernel(codes, bs, rs_, out, ROWS: tl.constexpr, COLS: tl.constexpr, CW: tl.constexpr,
                         CHUNK: tl.constexpr, PW: tl.constexpr, FMT: tl.constexpr):
    # out [ROWS, COLS] fp32: the read copy decoded the way the decode kernels stream it
    rows = tl.arange(0, ROWS)
    jw = tl.arange(0, CHUNK // PW)
    rsc = tl.load(rs_ + rows)
    for c in tl.static_range(COLS // CHUNK):
        words, bscale = load_read_words(codes, bs, rows, rows < ROWS, c, COLS, CW, CHUNK, PW, CHUNK // PW)
        for w in tl.static_range(PW):
            col = c * CHUNK + jw * PW + w
            tl.store(out + rows[:, None] * COLS + col[None, :],
                     word_values(words, w, FMT) * bscale * rsc[:, None])


@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_read_words_decode_bit_exact(fmt, chunk):
    """The word-wise decode of the streaming kernels gives the reference's dequantized values bit for bit."""
    rows, cols = 16, 64
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(rows, cols, generator=gen) * torch.logspace(-3, 2, cols)
    x[3] = 0.0                                                     # a zero row: scales 0
    codes, bs, rsc = (t.to(DEVICE) for t in rs.formats.quantize(x, fmt))
    out = torch.full((rows, cols), float("nan"), device=DEVICE)
    cw = codes.shape[-1]
    _decode_words_kernel[(1,)](codes, bs, rsc, out, ROWS=rows, COLS=cols, CW=cw, CHUNK=chunk,
                               PW=4 if fmt == "fp8" else 8, FMT=READ_CODES[fmt])
    assert torch.equal(out.cpu(), rs.formats.dequantize(codes.cpu(), bs.cpu(), rsc.cpu(), fmt))


@triton.jit
def _e2m1_kernel(x, out, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out + o, e2m1_encode(tl.load(x + o)))


def test_e2m1_encode_matches_the_reference_ladder():
    """The kernels' e2m1 rounding (a unit grid per code group, rounded by adding 2^23) gives the
    reference's threshold-ladder codes at every threshold, one ulp either side, and at random
    values of both signs (all 1.09e9 fp32 magnitudes in [0, 6] agreed when checked once)."""
    edges = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0])
    near = torch.cat([edges, torch.nextafter(edges, torch.tensor(0.0)), torch.nextafter(edges, torch.tensor(7.0))])
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([near, -near, (torch.rand(4096 - 6 * len(edges), generator=gen) * 12 - 6)]).clamp(-6, 6)
    out = torch.full((4096,), 255, dtype=torch.uint8, device=DEVICE)
    _e2m1_kernel[(1,)](x.to(DEVICE), out, N=4096)
    assert torch.equal(out.cpu(), rs.formats.e2m1_encode(x))


@triton.jit
def _fp16_sr_kernel(x, u, out, N: tl.constexpr):
    o = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out + o, fp16_stochastic_round(tl.load(x + o), tl.load(u + o)))


def test_fp16_stochastic_round_matches_the_reference_bit_for_bit():
    """The kernels' stochastic rounding to fp16 (the probability of rounding up as ``(a - lo)`` times
    the exact reciprocal of the power-of-two gap) gives the reference's fp16 bits, which divide by the
    gap: at fp16 values and one fp32 ulp either side, across the normal and subnormal binades, at the
    saturation bound and beyond, at zero and random values of both signs, each with draws just below
    and above its probability and random draws."""
    gen = torch.Generator().manual_seed(11)
    h = torch.arange(0, 0x7C00, 37, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    near = torch.cat([h, torch.nextafter(h, torch.tensor(1e6)), torch.nextafter(h, torch.tensor(0.0))])
    rnd = torch.cat([torch.randn(2048, generator=gen) * 10.0 ** torch.randint(-8, 5, (2048,), generator=gen),
                     torch.tensor([65504.0, 65519.0, 7e4, 1e9, 0.0, -0.0, 5.9e-8, 3e-8])])
    x = torch.cat([near, -near, rnd])
    x = x[: (x.numel() // 1024) * 1024]
    a = x.abs().clamp(max=65504.0)
    lo = rs.formats.fp16_stochastic_round(x.abs(), torch.ones_like(x) * 0.999999).float()   # never up
    hi = rs.formats.fp16_stochastic_round(x.abs(), torch.zeros_like(x)).float()             # up if any
    p = torch.where(hi > lo, (a - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(a)), torch.zeros_like(a))
    below, above = torch.nextafter(p, torch.tensor(0.0)), torch.nextafter(p, torch.tensor(1.0)).clamp(max=0.999)
    for u in (below, above, torch.rand(x.shape, generator=gen)):
        out = torch.zeros(x.shape, dtype=torch.float16, device=DEVICE)
        _fp16_sr_kernel[(x.numel() // 1024,)](x.to(DEVICE), u.to(DEVICE), out, N=1024)
        want = rs.formats.fp16_stochastic_round(x, u)
        assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))


def _is_tf32(x):
    return ((x.view(torch.int32) & 0x1FFF) == 0).all().item()


def test_read_copy_values_are_exact_tf32_operands():
    """Before their row scale, read-copy values (an e2m1 or e4m3 code times an e4m3 block scale) have
    at most 8 significant bits, so tf32 holds every one exactly: ``dot_fp32`` takes them in one pass."""
    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    scales = scales[torch.isfinite(scales)]
    fp8 = scales                                                         # e4m3 codes: the same values
    e2m1 = rs.formats.e2m1_decode(torch.arange(16))
    for codes in (fp8, e2m1):
        values = codes[:, None] * scales[None, :]
        assert torch.isfinite(values).all() and _is_tf32(values)
        assert not _is_tf32(values * 1.1)                                # the check can fail


@triton.jit
def _dot_fp32_kernel(a, b, acc, out, A_EXACT: tl.constexpr, B_EXACT: tl.constexpr, DOT: tl.constexpr):
    o = tl.arange(0, 16)
    tile = o[:, None] * 16 + o[None, :]
    got = dot_fp32(tl.load(a + tile), tl.load(b + tile), tl.load(acc + tile), A_EXACT, B_EXACT, DOT)
    tl.store(out + tile, got)


@pytest.mark.parametrize("a_exact", [False, True])
@pytest.mark.parametrize("b_exact", [False, True])
def test_dot_fp32_is_fp32_accurate_with_fewer_passes_on_exact_operands(a_exact, b_exact):
    """``dot_fp32`` at "tf32x3" keeps fp32 accuracy whichever operands are declared exact (and are:
    bf16 values), and loses it when an inexact operand is declared exact (one tf32 rounding)."""
    gen = torch.Generator().manual_seed(int(a_exact) * 2 + int(b_exact))

    def operand(exact):
        x = torch.randn(16, 16, generator=gen) * torch.logspace(-2, 2, 16)
        return x.bfloat16().float() if exact else x

    a, b, acc = operand(a_exact), operand(b_exact), torch.randn(16, 16, generator=gen)
    want = acc.double() + a.double() @ b.double()

    def run(ax, bx):
        out = torch.full((16, 16), float("nan"), device=DEVICE)
        _dot_fp32_kernel[(1,)](a.to(DEVICE), b.to(DEVICE), acc.to(DEVICE), out, A_EXACT=ax, B_EXACT=bx, DOT="tf32x3")
        return (out.cpu().double() - want).norm().item() / want.norm().item()

    assert run(a_exact, b_exact) < 2e-6
    if not (a_exact and b_exact):
        assert run(True, True) > 1e-5                                    # a false claim shows


def test_padded_rows_and_owned_vk_checkpoint():
    spec = SPECS["kda"]
    NL, S = 1, 4
    storage = torch.full((NL, S + 1, spec.num_v_heads, spec.head_v_dim, spec.head_k_dim), float("nan"), device=DEVICE)
    cfg = rs.ReplayConfig(window=3)
    tri = rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend="triton",
                       checkpoint=storage[:, 1:], state_layout="vk")
    ref = rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend="reference")
    st, sr = tri.alloc(2), ref.alloc(2)
    gen = torch.Generator().manual_seed(3)
    params = Params(spec, 1, gen)
    pad = lambda s: torch.stack((s[0], torch.tensor(-1, device=DEVICE), s[1]))  # noqa: E731
    for _ in range(7):
        inp = make_inputs(spec, params, 0, 3, None, gen, device=DEVICE)
        out = torch.full((3, spec.num_v_heads, spec.head_v_dim), float("nan"), device=DEVICE)
        y_t = rs.decode(tri, 0, pad(st), out=out, **inp)
        y_r = rs.decode(ref, 0, pad(sr), **inp)
        assert y_t[1].eq(0).all() and torch.isfinite(y_t).all()
        assert rms_ratio(y_t, y_r) < 2e-5
    assert torch.isnan(storage[:, 0]).all()
    assert rms_ratio(tri.read_state(0, st), ref.read_state(0, sr)) < 1e-5
    for name in ("k", "v", "g", "beta"):
        assert torch.equal(ref.ring[name], tri.ring[name])


@pytest.mark.parametrize("read_format", ["checkpoint", "fp8", "nvfp4"])
@pytest.mark.parametrize("family,layout", [("mamba2", "kv"), ("gdn", "kv"), ("gdn", "vk"), ("kda", "kv"), ("kda",
                                                                                                           "vk")])
def test_decode_tiles_of_several_chunks(monkeypatch, family, layout, read_format):
    """Decode tiles that stream the state's columns (key channels) in two chunks, with and without
    the chunks' products accumulated (``acc``), on both delta checkpoint layouts: outputs match
    the reference, rings and cursors are bit-exact, and the checkpoint after the flushes matches
    (a decode on the checkpoint folds its flush rows in the same launch, here in two
    ``fold_chunk`` pieces too)."""
    if family == "mamba2":
        spec = rs.LayerSpec.mamba2(num_heads=4, head_dim=6, state_dim=32, num_groups=2)
        heads, dim = spec.num_heads, spec.head_dim
    else:
        spec = getattr(rs.LayerSpec, family)(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=5)
        heads, dim = spec.num_v_heads, spec.head_v_dim
    cfg = rs.ReplayConfig(window=4, read_format=read_format)
    NL, S, n = 1, 5, 3
    for acc in (False, True):
        tile = dict(rows=16, num_warps=1, chunk=16, stages=2, acc=acc)
        for table, kind in (("mamba2", "decode"), ("mamba2", "read_fp8"), ("mamba2", "read"), ("delta", "decode"),
                            ("delta", "decode_vk"), ("delta", "read_fp8"), ("delta", "read"), ("kda", "decode"),
                            ("kda", "decode_vk"), ("kda", "read_fp8"), ("kda", "read")):
            folds = kind.startswith("decode")                  # the decode launch folds its flush rows too
            monkeypatch.setitem(ops.TILES[table], kind, dict(tile, fold_chunk=16, dot="tf32x3") if folds else tile)
        owned = None
        if layout == "vk":
            owned = torch.full((NL, S, spec.num_v_heads, spec.head_v_dim, spec.head_k_dim), float("nan"), device=DEVICE)
        tri = rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend="triton", checkpoint=owned,
                           state_layout=layout)
        ref = rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend="reference")
        st, sr = tri.alloc(n), ref.alloc(n)
        gen = torch.Generator().manual_seed(11)
        params = Params(spec, 1, gen)
        for _ in range(2 * cfg.window + 1):
            inp = make_inputs(spec, params, 0, n, None, gen, device=DEVICE)
            out = torch.full((n, heads, dim), float("nan"), device=DEVICE)
            y_t = rs.decode(tri, 0, st, out=out, **inp)
            y_r = rs.decode(ref, 0, sr, **inp)
            assert rms_ratio(y_t, y_r) < _pair_tol(cfg, decode_only=True), (acc, rms_ratio(y_t, y_r))
        for name in ref.ring:
            if name != "d":
                assert torch.equal(ref.ring[name], tri.ring[name]), (acc, name)
        for name in ref.cursors:
            assert torch.equal(ref.cursors[name], tri.cursors[name]), (acc, name)
        assert rms_ratio(tri.read_state(0, st), ref.read_state(0, sr)) < 1e-5


# (dims, family, read format, checkpoint dtype, the flush tiles' key runs: None = the tiles'; tiny dims
# have K = 32, so 16 is two runs, 0 the [K, BV] tile)
VK_CASES = [("tiny", "gdn", "nvfp4", "float32", None), ("tiny", "gdn", "nvfp4", "float16_sr", 16),
            ("tiny", "gdn", "fp8", "float32", 0), ("tiny", "gdn", "fp8", "bfloat16", None),
            ("tiny", "kda", "nvfp4", "float32", 16), ("tiny", "kda", "fp8", "bfloat16", None)]
if CUDA:
    VK_CASES += [("real", f, rf, "float32", None) for f in ("gdn", "kda") for rf in ("fp8", "nvfp4")]
    VK_CASES += [("real", "gdn", "nvfp4", "float16_sr", None)]


@pytest.mark.parametrize("dims,family,read_format,checkpoint_dtype,key_runs", VK_CASES)
def test_vk_read_copy_passes_match_kv_and_reference(dims, family, read_format, checkpoint_dtype, key_runs,
                                                    monkeypatch):
    """Behind a read copy on a ``[S, HV, V, K]`` checkpoint (the flush passes' ``flush_replay_vk`` /
    ``verify_flush_vk`` tiles, at their key runs or ``key_runs``; tiny dims: K = 32; real dims: the
    model's): decodes, verifies (T = 2 to 4) with flush rows, a flush-only launch, padded rows, two
    value tiles (tiny: V = 20).
    Against the reference and the same steps on a ``[S, HV, K, V]`` checkpoint: outputs
    (NaN-poisoned) within the pair tolerance, padded rows zero, rings and cursors bit-exact, the
    read copy byte for byte the encoding of the stored checkpoint, the checkpoints alike, and the
    owned checkpoint's rows outside the pool untouched."""
    if dims == "real":
        spec = MODEL_SPECS["qwen3.5" if family == "gdn" else "kimi-linear"]
    else:
        spec = getattr(rs.LayerSpec, family)(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=20)
    if key_runs is not None:
        table = ops.TILES["kda" if family == "kda" else "delta"]
        for kind in ("flush_replay_vk", "verify_flush_vk"):
            monkeypatch.setitem(table, kind, dict(table[kind], key_runs=key_runs))
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=3, read_format=read_format, checkpoint_dtype=checkpoint_dtype,
                          seed=3)
    NL, S, n = 1, 4, 3
    storage = torch.full((NL, S + 1, spec.num_v_heads, spec.head_v_dim, spec.head_k_dim), float("nan"),
                         dtype=cfg.torch_checkpoint_dtype, device=DEVICE)
    pools = {"vk": rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend="triton",
                                checkpoint=storage[:, 1:], state_layout="vk"),
             "kv": rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend="triton"),
             "reference": rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend="reference")}
    slots = {k: p.alloc(n) for k, p in pools.items()}
    rows = {k: torch.stack((s[0], torch.tensor(-1, device=DEVICE), s[1], s[2])) for k, s in slots.items()}
    gen = torch.Generator().manual_seed(29)
    params = Params(spec, 1, gen)
    tol = _pair_tol(cfg)
    for step in range(3 * cfg.window + 2):
        if step == 2 * cfg.window:                     # a flush-only launch (T = 0) mid-window
            for k, p in pools.items():
                p.flush(slots[k])
        T = 2 + step % 3 if step % 3 == 1 else None
        inp = make_inputs(spec, params, 0, n + 1, T, gen, device=DEVICE)
        shape = (n + 1, spec.num_v_heads, spec.head_v_dim) if T is None else (n + 1, T, spec.num_v_heads,
                                                                              spec.head_v_dim)
        fn = rs.decode if T is None else rs.verify
        ys = {k: fn(p, 0, rows[k], out=torch.full(shape, float("nan"), device=DEVICE), **inp)
              for k, p in pools.items()}
        assert torch.isfinite(ys["vk"]).all(), "kernel left outputs unwritten"
        assert ys["vk"][1].eq(0).all(), "a padded row's output is zero"
        assert rms_ratio(ys["vk"], ys["kv"]) < tol, step
        assert rms_ratio(ys["vk"], ys["reference"]) < tol, step
        if T is not None:
            acc = torch.randint(1, T + 1, (n + 1,), generator=gen)
            for k, p in pools.items():
                p.commit(rows[k], acc)
        for other in ("kv", "reference"):
            for name in pools[other].ring:
                if name != "d":
                    assert torch.equal(pools["vk"].ring[name], pools[other].ring[name]), (step, other, name)
            for name in pools[other].cursors:
                assert torch.equal(pools["vk"].cursors[name], pools[other].cursors[name]), (step, other, name)
        vk = pools["vk"]
        ck = vk.checkpoint[:, slots["vk"]].float().transpose(-1, -2)
        for name, want in zip(("codes", "block_scale", "row_scale"), rs.formats.quantize(ck, read_format)):
            got = vk.read[name][:, slots["vk"]]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (step, f"read copy {name} differs")
    assert torch.isnan(storage[:, 0].float()).all(), "a row outside the pool was written"
    ck_tol = 1e-5 if checkpoint_dtype == "float32" else 2e-2
    for other in ("kv", "reference"):
        assert rms_ratio(pools["vk"].checkpoint[:, slots["vk"]].float(),
                         pools[other].checkpoint[:, slots[other]].float()) < ck_tol, other
        assert rms_ratio(pools["vk"].read_state(0, slots["vk"]), pools[other].read_state(0, slots[other])) < ck_tol
    assert rms_ratio(pools["vk"].ring["d"], pools["reference"].ring["d"]) < tol


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_a_register_cap_changes_no_bit(family, monkeypatch):
    """A tile's ``maxnreg`` (registers per thread) reaches the launch of its pass and changes no bit:
    behind an NVFP4 read copy (GDN / KDA on a ``[S, HV, V, K]`` checkpoint), decodes with flush rows,
    verifies and commits give the same outputs and buffers with every step tile capped at 168
    registers as with the tiles in use stripped of their caps (on a GPU, at the model's dims: the
    capped kernels compile otherwise)."""
    real = {"mamba2": "nemotron-h", "gdn": "qwen3.5", "kda": "kimi-linear"}[family]
    tiny = (rs.LayerSpec.mamba2(num_heads=4, head_dim=6, state_dim=32, num_groups=2) if family == "mamba2" else
            getattr(rs.LayerSpec, family)(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=20))
    spec = MODEL_SPECS[real] if CUDA else tiny
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format="nvfp4", seed=5)
    launched = []
    monkeypatch.setattr(plan, "_log_first", launched.append)
    gen = torch.Generator().manual_seed(31)
    params = Params(spec, 1, gen)
    steps = []
    for step in range(2 * cfg.window + 1):
        T = 2 + step % 2 if step % 3 == 2 else None
        steps.append((T, make_inputs(spec, params, 0, 3, T, gen, device=DEVICE),
                      torch.randint(1, (T or 1) + 1, (3,), generator=gen)))
    results = []
    table = ops.TILES["kda" if family == "kda" else "delta" if family == "gdn" else "mamba2"]
    for cap in (None, 168):
        for kind in ("decode", "decode_vk", "read", "read_fp8", "verify", "verify_read", "flush", "flush_vk",
                     "flush_replay", "flush_replay_vk", "verify_flush", "verify_flush_vk"):
            if kind in table:
                tile = {k: v for k, v in table[kind].items() if k != "maxnreg"}
                monkeypatch.setitem(table, kind, tile if cap is None else dict(tile, maxnreg=cap))
        if family == "mamba2":
            pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=4, device=DEVICE, backend="triton")
        else:
            storage = torch.zeros(1, 4, spec.num_v_heads, spec.head_v_dim, spec.head_k_dim, device=DEVICE)
            pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=4, device=DEVICE, backend="triton",
                                checkpoint=storage, state_layout="vk")
        slots = pool.alloc(3)
        launched.clear()
        ys = []
        for T, inp, acc in steps:
            ys.append((rs.decode if T is None else rs.verify)(pool, 0, slots, **inp))
            if T is not None:
                pool.commit(slots, acc.clamp(max=T))
        assert {key[-1] for key in launched} == {cap}, launched
        results.append((ys, {name: b.contiguous().clone() for name, b in
                             (("checkpoint", pool.checkpoint), *pool.read.items(), *pool.ring.items(),
                              *pool.cursors.items())}))
    (ys_a, bufs_a), (ys_b, bufs_b) = results
    assert all(torch.equal(a, b) for a, b in zip(ys_a, ys_b))
    for name in bufs_a:
        assert torch.equal(bufs_a[name].view(torch.uint8), bufs_b[name].view(torch.uint8)), name


@pytest.mark.parametrize("read_format", ["checkpoint", "nvfp4"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_q_scale_equals_a_scaled_q(family, read_format):
    """A factor per token and key head on 16-bit q (``q_scale``, here a host's inverse L2 norm)
    gives the outputs of the scaled q in fp32, through decodes and verifies with flush rows in
    every pass (decode, verify, flush; read copy or not); the reference takes it alike. Rings,
    cursors and checkpoints evolve identically (q enters outputs only)."""
    spec = SPECS[family]
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=3, read_format=read_format)
    n, S = 3, 5
    pools = {k: rs.StatePool(spec, cfg, num_layers=1, num_slots=S, device=DEVICE, backend=b)
             for k, b in (("scaled", "triton"), ("factor", "triton"), ("reference", "reference"))}
    slots = {k: p.alloc(n) for k, p in pools.items()}
    gen = torch.Generator().manual_seed(21)
    params = Params(spec, 1, gen)
    for step in range(3 * cfg.window):
        T = 1 + step % 4 if step % 2 else None
        inp = make_inputs(spec, params, 0, n, T, gen, device=DEVICE)
        q16 = (inp["q"] * 3.0).to(torch.bfloat16)
        q_scale = torch.rsqrt(q16.float().square().sum(-1) + 1e-6)
        fn = rs.decode if T is None else rs.verify
        shape = (n, spec.num_v_heads, spec.head_v_dim) if T is None else (n, T, spec.num_v_heads, spec.head_v_dim)
        ys = {k: fn(p, 0, slots[k], out=torch.full(shape, float("nan"), device=DEVICE),
                    **(dict(inp, q=q16.float() * q_scale[..., None]) if k == "scaled"
                       else dict(inp, q=q16, q_scale=q_scale)))
              for k, p in pools.items()}
        assert torch.isfinite(ys["factor"]).all(), "kernel left outputs unwritten"
        assert rms_ratio(ys["factor"], ys["scaled"]) < 1e-5, step
        assert rms_ratio(ys["factor"], ys["reference"]) < _pair_tol(cfg), step       # decodes read verified d too
        if T is not None:
            acc = torch.randint(1, T + 1, (n,), generator=gen)
            for k, p in pools.items():
                p.commit(slots[k], acc)
    for name in pools["scaled"].cursors:
        assert torch.equal(pools["scaled"].cursors[name], pools["factor"].cursors[name]), name
    for name in pools["scaled"].ring:
        if name != "d":
            assert torch.equal(pools["scaled"].ring[name], pools["factor"].ring[name]), name
    assert torch.equal(pools["scaled"].checkpoint, pools["factor"].checkpoint)


@pytest.mark.parametrize("family,read_format,drafts,verify_fold", [
    ("mamba2", "nvfp4", 0, None), ("gdn", "fp8", 0, None), ("kda", "nvfp4", 0, None),
    *[(f, "checkpoint", 2, fold) for f in ("mamba2", "gdn", "kda") for fold in (True, False)]])
def test_flush_pass_finds_the_flush_rows_of_staggered_rows(monkeypatch, family, read_format, drafts, verify_fold):
    """Rows at different fills (random subsets step), unsorted slots with padded rows, more rows
    than a flush program scans at once and more flush rows than programs: every flush row is
    folded exactly once (outputs match the reference, rings and cursors bit-exact, checkpoints
    match). Decode tiles with ``fold=False``: a decode on the checkpoint takes the flush pass too;
    a verify on the checkpoint folds its flush rows in the verify kernel (``verify_fold``) or in
    the flush pass after it."""
    monkeypatch.setattr(plan, "FLUSH_SCAN_ROWS", 16)
    for table in ops.TILES.values():
        for kind, tile in table.items():
            if "row_programs" in tile:
                monkeypatch.setitem(table, kind, dict(tile, row_programs=3))
            elif kind.startswith("decode"):         # a decode on the checkpoint takes the flush pass too
                monkeypatch.setitem(table, kind, dict(tile, fold=False))
            elif kind == "verify" and verify_fold is not None:
                monkeypatch.setitem(table, kind, dict(tile, fold=verify_fold))
    spec = SPECS[family]
    heads, dim = (spec.num_heads, spec.head_dim) if family == "mamba2" else (spec.num_v_heads, spec.head_v_dim)
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=drafts, read_format=read_format)
    S, n = 24, 21
    pools = {b: rs.StatePool(spec, cfg, num_layers=1, num_slots=S, device=DEVICE, backend=b)
             for b in ("reference", "triton")}
    gen = torch.Generator().manual_seed(5)
    allocated = {b: p.alloc(n) for b, p in pools.items()}
    assert torch.equal(allocated["reference"], allocated["triton"])
    slots = allocated["triton"][torch.randperm(n, generator=gen)]
    params = Params(spec, 1, gen)
    for step in range(3 * cfg.window):
        keep = torch.rand(n, generator=gen) < (0.4 if step < cfg.window else 0.8)
        rows = torch.where(keep.to(slots.device), slots, -1)
        T = 1 + step % 3 if drafts and step % 2 else None
        inp = make_inputs(spec, params, 0, n, T, gen, device=DEVICE)
        shape = (n, heads, dim) if T is None else (n, T, heads, dim)
        fn = rs.decode if T is None else rs.verify
        ys = {b: fn(p, 0, rows, out=torch.full(shape, float("nan"), device=DEVICE), **inp) for b, p in pools.items()}
        assert torch.isfinite(ys["triton"]).all(), "kernel left outputs unwritten"
        assert rms_ratio(ys["triton"], ys["reference"]) < _pair_tol(cfg, decode_only=T is None), step
        if T is not None:
            acc = torch.randint(1, T + 1, (n,), generator=gen)
            for p in pools.values():
                p.commit(rows, acc)
    ref, tri = pools["reference"], pools["triton"]
    assert len(set(tri.cursors["count"][0, slots].tolist())) > 1, "the rows should have different fills"
    for name in ref.ring:
        if name != "d":
            assert torch.equal(ref.ring[name], tri.ring[name]), name
    for name in ref.cursors:
        assert torch.equal(ref.cursors[name], tri.cursors[name]), name
    assert rms_ratio(tri.checkpoint.float(), ref.checkpoint.float()) < 1e-5


def test_ops_refuse_a_read_format_without_its_buffers_and_heads_that_do_not_divide():
    """Op-level checks a host calling the torch ops directly meets (the pool passes consistent buffers):
    a read copy's format without its buffers, and head counts whose ratio the kernels index by."""
    spec, cfg = SPECS["gdn"], rs.ReplayConfig(window=4, read_format="nvfp4")
    pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=3, device=DEVICE, backend="triton")
    slots = pool.alloc(2)
    from replayssm.kernels.backend import layer_state
    buffers = layer_state(pool, 0)
    with pytest.raises(ValueError, match="read_codes: a read copy .* needs its codes"):
        ops.refresh_read_copy(checkpoint=buffers["checkpoint"], slots=slots, read_codes=None, read_block_scale=None,
                              read_row_scale=None, is_delta=True, read_format=READ_CODES["nvfp4"])
    inp = make_inputs(spec, Params(spec, 1, torch.Generator().manual_seed(3)), 0, 2, None,
                      torch.Generator().manual_seed(3), device=DEVICE)
    ring = {name: buf[0] for name, buf in pool.ring.items()}
    odd = torch.empty(3, 3, *ring["k"].shape[2:], dtype=ring["k"].dtype, device=DEVICE)      # 3 key heads
    with pytest.raises(ValueError, match=r"ring_k: 4 value heads need a key head count dividing them, got 3"):
        ops.delta_plan(buffers["checkpoint"], None, None, None, odd, ring["v"], ring["g"], ring["beta"], ring["d"],
                       pool.cursors["count"][0], pool.cursors["origin"][0], pool.cursors["epoch"][0], slots,
                       inp["q"][:, None], inp["k"][:, None], inp["v"][:, None], inp["g"][:, None],
                       inp["beta"][:, None], torch.empty_like(inp["v"][:, None]), 1.0, 4, True, 0,
                       READ_CODES["checkpoint"], 0)


def test_ops_are_registered_with_mutation_schemas():
    import replayssm.kernels.ops  # noqa: F401
    schema = str(torch.ops.replayssm.delta_step.default._schema)
    for arg in ("checkpoint", "ring_k", "ring_v", "ring_g", "ring_beta", "ring_d", "out"):
        assert re.search(rf"Tensor\(a\d+!\) {arg},", schema), (arg, schema)
    assert re.search(r"Tensor count,", schema)  # cursors are read, not written
    assert "Tensor slots" in str(torch.ops.replayssm.mamba2_step.default._schema)
    assert hasattr(torch.ops.replayssm, "commit") and hasattr(torch.ops.replayssm, "advance")


def test_warmup_compiles_and_logs_first_launches(caplog):
    import logging

    from replayssm.kernels import warmup
    from replayssm.kernels.plan import _compiled
    spec = rs.LayerSpec.gdn(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=8)
    cfg = rs.ReplayConfig(window=3, max_draft_tokens=1, seed=7)
    _compiled.clear()
    with caplog.at_level(logging.INFO, logger="replayssm"):
        assert warmup(spec, cfg, device=DEVICE, tokens=(1, 2)) == 2
    firsts = [r.getMessage() for r in caplog.records if "first launch" in r.getMessage()]
    assert any("'T', 1" in m for m in firsts) and any("'T', 2" in m for m in firsts)


GATING_CASES = {"tiny-gdn": (5, 3, 6, 24), "tiny-kda": (4, 2, 4, 16)}
if CUDA:
    GATING_CASES.update({f"real-{k}": (257, s.num_k_heads, s.num_v_heads, s.head_k_dim)
                         for k, s in MODEL_SPECS.items() if s.family in ("gdn", "kda")})


@pytest.mark.parametrize("case", sorted(GATING_CASES))
@pytest.mark.parametrize("gate", ["softplus", "softplus-beta-round", "safe", "fla-softplus-beta-2", "no-l2norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gating_kernel_matches_the_reference_bit_for_bit(case, gate, dtype):
    """``replayssm::delta_gating`` (one launch) gives the reference's bits for q_scale, k in the ring
    dtype, g and beta: inputs as strided views of one packed row (SGLang's ``mixed_qkv``), gate inputs
    over a wide range (softplus' threshold crossed both ways), SGLang's and fla's normalisations and
    none, outputs NaN-poisoned."""
    N, HK, HV, K = GATING_CASES[case]
    kda = "kda" in case or "kimi" in case
    if gate == "safe" and not kda:
        pytest.skip("the safe gate is KDA's")
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case}-{gate}-{dtype}".encode()))
    packed = (torch.randn(N, 2 * HK * K + 1, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))).to(dtype)
    q, k = packed[:, : HK * K].view(N, HK, K), packed[:, HK * K: 2 * HK * K].view(N, HK, K)
    gate_shape = (N, HV, K) if kda else (N, HV)
    a = (torch.randn(*gate_shape, generator=gen) * 12).to(dtype)           # a + dt_bias beyond +-20 at times
    b = (torch.randn(N, HV, generator=gen) * 4).to(dtype)
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(gate_shape[1:], generator=gen) * 4
    lower_bound = -5.0 if gate == "safe" else None
    beta_round = gate == "softplus-beta-round"
    l2norm = {"fla-softplus-beta-2": "fla", "no-l2norm": None}.get(gate, "sglang")
    softplus = dict(softplus_beta=2.0, softplus_threshold=15.0) if gate == "fla-softplus-beta-2" else {}
    ring = torch.float32 if dtype == torch.float32 else torch.bfloat16
    want = gating_ref(q, k, a, b, A_log, dt_bias, ring_dtype=ring, lower_bound=lower_bound,
                      beta_dtype=b.dtype if beta_round else None, l2norm=l2norm, **softplus)
    assert ("q_scale" in want) == (l2norm is not None)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    got = dict(q_scale=torch.full((N, HK), float("nan"), device=DEVICE),
               k=torch.full((N, HK, K), float("nan"), dtype=ring, device=DEVICE),
               g=torch.full(gate_shape, float("nan"), device=DEVICE),
               beta=torch.full((N, HV), float("nan"), device=DEVICE))
    if l2norm is None:
        del got["q_scale"]
    packed = dev(packed)
    ops.delta_gating(packed[:, : HK * K].view(N, HK, K), packed[:, HK * K: 2 * HK * K].view(N, HK, K), dev(a), dev(b),
                     dev(A_log), dev(dt_bias), got.get("q_scale"), got["k"], got["g"], got["beta"],
                     lower_bound=lower_bound, beta_round=beta_round, l2norm={"sglang": 1, "fla": 2, None: 0}[l2norm],
                     **softplus)
    for name, t in got.items():
        bits = torch.int16 if t.element_size() == 2 else torch.int32
        assert torch.equal(t.cpu().view(bits), want[name].view(bits)), name


@pytest.mark.parametrize("case", sorted(GATING_CASES))
def test_gating_heads_per_program_give_the_same_bits(case):
    """Every split of a token's heads over programs (``heads_per_program``: 1, 2, 4, all and the
    tile's, blocks past the key heads included) writes the reference's bits in every output element."""
    N, HK, HV, K = GATING_CASES[case]
    kda = "kda" in case or "kimi" in case
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    q, k = torch.randn(N, HK, K, generator=gen).to(torch.bfloat16), torch.randn(N, HK, K, generator=gen).to(torch.bfloat16)
    gate_shape = (N, HV, K) if kda else (N, HV)
    a, b = torch.randn(*gate_shape, generator=gen) * 6, torch.randn(N, HV, generator=gen) * 4
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(gate_shape[1:], generator=gen)
    want = gating_ref(q, k, a, b, A_log, dt_bias, ring_dtype=torch.bfloat16)
    for heads in (1, 2, 4, 0, None):                  # None: the gating tile's
        got = dict(q_scale=torch.full((N, HK), float("nan"), device=DEVICE),
                   k=torch.full((N, HK, K), float("nan"), dtype=torch.bfloat16, device=DEVICE),
                   g=torch.full(gate_shape, float("nan"), device=DEVICE), beta=torch.full((N, HV), float("nan"),
                                                                                        device=DEVICE))
        ops.delta_gating(*(t.to(DEVICE) for t in (q, k, a, b, A_log, dt_bias)), got["q_scale"], got["k"], got["g"],
                         got["beta"], heads_per_program=heads)
        for name, t in got.items():
            bits = torch.int16 if t.element_size() == 2 else torch.int32
            assert torch.equal(t.cpu().view(bits), want[name].view(bits)), (heads, name)
    with pytest.raises(ValueError, match="heads_per_program: expected 0"):
        ops.delta_gating(*(t.to(DEVICE) for t in (q, k, a, b, A_log, dt_bias)), got["q_scale"], got["k"], got["g"],
                         got["beta"], heads_per_program=3)


def test_gating_refuses_bad_input_naming_the_argument():
    """``replayssm.gating`` checks shapes, strides and the family, and names what was wrong."""
    gdn = rs.StatePool(SPECS["gdn"], rs.ReplayConfig(window=4), num_layers=1, num_slots=2, device=DEVICE,
                       backend="reference")
    HK, HV, K = SPECS["gdn"].num_k_heads, SPECS["gdn"].num_v_heads, SPECS["gdn"].head_k_dim
    ok = dict(q=torch.randn(3, HK, K), k=torch.randn(3, HK, K), a=torch.randn(3, HV), b=torch.randn(3, HV),
              A_log=torch.randn(HV), dt_bias=torch.randn(HV))
    ok = {n: t.to(DEVICE) for n, t in ok.items()}
    made = rs.gating(gdn, **ok)
    assert made["k"].dtype == gdn.cfg.torch_ring_dtype and made["g"].shape == (3, HV)
    for name, bad, match in (("a", torch.randn(3, HV, K, device=DEVICE), r"a: expected shape \[3, 4\]"),
                             ("dt_bias", torch.randn(HV, 1, device=DEVICE), r"dt_bias: expected shape \[4\]"),
                             ("k", torch.randn(3, K, HK, device=DEVICE).transpose(1, 2),
                              "k: expected a contiguous last dimension"),
                             ("A_log", torch.randn(2 * HV, device=DEVICE)[::2], "A_log: expected a contiguous")):
        with pytest.raises(ValueError, match=match):
            rs.gating(gdn, **dict(ok, **{name: bad}))
    with pytest.raises(ValueError, match="lower_bound: the safe gate is KDA's"):
        rs.gating(gdn, **ok, lower_bound=-5.0)
    with pytest.raises(ValueError, match="l2norm: expected one of"):
        rs.gating(gdn, **ok, l2norm="l2")
    with pytest.raises(ValueError, match="softplus_beta: expected a positive factor"):
        rs.gating(gdn, **ok, softplus_beta=0.0)
    assert set(rs.gating(gdn, **ok, l2norm=None)) == {"k", "g", "beta"}
    mamba = rs.StatePool(SPECS["mamba2"], rs.ReplayConfig(window=4), num_layers=1, num_slots=2, device=DEVICE,
                         backend="reference")
    with pytest.raises(ValueError, match="pool: gating forms GDN / KDA inputs"):
        rs.gating(mamba, **ok)
