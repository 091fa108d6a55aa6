"""TRT-LLM cache bookkeeping (ReplayMambaStates) over a framework-owned state tensor, on the reference
backend: outputs against the fp64 step recurrence, rings / cursors / checkpoint bit-exact against a
standalone StatePool fed the same steps, TRT-LLM-style accept counts with context rows in front."""

import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import SPECS, TOL, Params, f64, make_inputs, rms_ratio, step_oracle, token

import replayssm as rs
from replayssm.integrations.trtllm.cache import ReplayMambaStates, cache_manager_class, commit_conv_windows
from test_unchecked import HostReads

NL, S = 2, 5
# TRT-LLM's state_indices: a subset, unordered, with its shared CUDA-graph padding slot (1) twice
SLOTS = torch.tensor([3, 1, 0, 1, 4])
PAD = (1,)
REF_SLOTS = torch.tensor([3, -1, 0, -1, 4])  # the same rows for a standalone pool
REAL = REF_SLOTS >= 0
REAL_SLOTS = REF_SLOTS[REAL]


def _heads_dim(spec):
    return (spec.num_heads, spec.head_dim) if spec.family == "mamba2" else (spec.num_v_heads, spec.head_v_dim)


def _framework_states(spec, cfg, layout):
    """TRT-LLM's temporal tensor: NaN everywhere, slot stride twice the state (any stride is allowed)."""
    shape = list(spec.state_shape)
    if spec.is_delta and layout == "vk":
        shape[-2:] = shape[-2:][::-1]
    big = torch.full((NL, S, 2, *shape), float("nan"), dtype=cfg.torch_checkpoint_dtype)
    return big[:, :, 1]


def _run(family, cfg, layout, steps=9, seed=0, backend="reference"):
    """``states`` and a standalone pool of the same backend stepped together; on the Triton backend
    ``states`` runs unchecked, and every host read of a device value by its calls lands in
    ``states.host_reads``."""
    spec = SPECS[family]
    gen = torch.Generator().manual_seed(seed)
    temporal = _framework_states(spec, cfg, layout)
    states = ReplayMambaStates(spec, cfg, temporal, state_layout=layout, backend=backend, padding_slots=PAD)
    states.host_reads = []
    for name in ("refresh", "decode", "verify", "update_mamba_states", "flush"):
        setattr(states, name, _watched(getattr(states, name), states.host_reads))
    # the standalone pool has a tensor of the same layout (the reference's float sums follow strides)
    ref = rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, backend=backend,
                       checkpoint=_framework_states(spec, cfg, layout), state_layout=layout)
    ref.alloc(S)
    params = Params(spec, NL, gen)
    n = SLOTS.numel()
    # prefill: TRT-LLM writes the state itself, then the rings of those slots are emptied
    init = torch.randn(NL, n, *spec.state_shape, generator=gen) * 0.1
    for layer in range(NL):
        temporal[layer, REAL_SLOTS] = (init[layer, REAL].transpose(-1, -2) if layout == "vk" and spec.is_delta
                                       else init[layer, REAL]).to(temporal.dtype)
        ref.write_state(layer, REF_SLOTS, init[layer])
    states.refresh(SLOTS)
    oracle = [init[layer, REAL].double() for layer in range(NL)]
    errs = []
    for i in range(steps):
        T = 3 if i % 3 == 2 else None
        acc = torch.randint(1, 4, (n,), generator=gen) if T else None
        for layer in range(NL):
            inp = make_inputs(spec, params, layer, n, T, gen, cfg.torch_ring_dtype)
            heads, dim = _heads_dim(spec)
            out = torch.full((n, *((T,) if T else ()), heads, dim), float("nan"), dtype=cfg.torch_ring_dtype)
            real = {k: (v[REAL] if isinstance(v, torch.Tensor) and v.shape[:1] == (n,) else v) for k, v in inp.items()}
            if T is None:
                y = states.decode(layer, SLOTS, out=out, **inp)
                y_ref = rs.decode(ref, layer, REF_SLOTS, **inp)
                y_o, oracle[layer] = step_oracle(spec, oracle[layer], f64(real))
            else:
                y = states.verify(layer, SLOTS, out=out, **inp)
                y_ref = rs.verify(ref, layer, REF_SLOTS, **inp)
                ys, St = [], oracle[layer]
                keep, a = oracle[layer].clone(), acc[REAL]
                for t in range(T):
                    yt, St = step_oracle(spec, St, f64(token(real, t)))
                    ys.append(yt)
                    keep[a == t + 1] = St[a == t + 1]
                y_o, oracle[layer] = torch.stack(ys, 1), keep
            assert y is out and torch.equal(y, y_ref) and bool((y[~REAL] == 0).all())
            errs.append(rms_ratio(y[REAL], y_o))
        if T:
            # TRT-LLM's call: a context request in row 0 (its entries must be ignored)
            meta = SimpleNamespace(num_contexts=1, num_seqs=n + 1)
            states.update_mamba_states(meta, torch.cat([torch.tensor([99]), acc]).int(),
                                       torch.cat([torch.tensor([2]), SLOTS]).int())
            ref.commit(REF_SLOTS, acc)
    return spec, states, ref, temporal, oracle, errs


def _watched(method, reads):
    def call(*args, **kwargs):
        with HostReads() as mode:
            result = method(*args, **kwargs)
        reads.extend(mode.found)
        return result
    return call


CASES = [(f, lay) for f in SPECS for lay in (("kv", "vk") if f != "mamba2" else ("kv",))]


@pytest.mark.parametrize("family", list(SPECS))
def test_triton_backend_steps_read_no_device_value(family):
    """On the Triton backend (its interpreter on a CPU) every method runs unchecked, as TRT-LLM's CUDA
    graphs need: outputs, rings, cursors and checkpoint equal a checked Triton pool's, and no call
    reads a device value on the host."""
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format="fp8")
    layout = "vk" if family != "mamba2" else "kv"
    spec, states, ref, _, oracle, errs = _run(family, cfg, layout, steps=6, backend="triton")
    assert states.checked is False and states.host_reads == [], states.host_reads
    assert max(errs) < TOL["fp8"]
    for k in ref.ring:
        assert torch.equal(states.pool.ring[k], ref.ring[k]), k
    for k in ref.cursors:                                       # the last column is the padded rows' scratch
        assert torch.equal(states.pool.cursors[k][:, :-1], ref.cursors[k][:, :-1]), k
    assert torch.equal(states.pool.checkpoint[:, REAL_SLOTS], ref.checkpoint[:, REAL_SLOTS])
    states.flush(SLOTS)
    assert states.host_reads == [] and (states.pool.cursors["count"][:, REAL_SLOTS] == 0).all()


@pytest.mark.parametrize("family,layout", CASES, ids=[f"{f}-{lay}" for f, lay in CASES])
def test_replay_over_framework_tensor(family, layout):
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2)
    spec, states, ref, temporal, oracle, errs = _run(family, cfg, layout)
    assert max(errs) < TOL["float32"]
    for k in ref.ring:
        assert torch.equal(states.pool.ring[k], ref.ring[k]), k
    for k in ref.cursors:
        assert torch.equal(states.pool.cursors[k], ref.cursors[k]), k
    assert torch.equal(states.pool.checkpoint[:, REAL_SLOTS], ref.checkpoint[:, REAL_SLOTS])
    # the padding slot and the context row's slot are never touched
    assert torch.isnan(temporal[:, 1]).all() and torch.isnan(temporal[:, 2]).all()
    for layer in range(NL):
        assert rms_ratio(states.read_state(layer, SLOTS)[REAL], oracle[layer]) < TOL["float32"]
    states.flush(SLOTS)
    assert (states.pool.cursors["count"][:, REAL_SLOTS] == 0).all()
    for layer in range(NL):
        view = states.get_ssm_states(layer)[REAL_SLOTS]
        canon = view.transpose(-1, -2) if layout == "vk" and spec.is_delta else view
        assert rms_ratio(canon, oracle[layer]) < TOL["float32"]


@pytest.mark.parametrize("family", list(SPECS))
def test_precision_split(family):
    """bf16 checkpoint + NVFP4 read copy: outputs within the NVFP4 tolerance, the state within bf16's."""
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, checkpoint_dtype="bfloat16", read_format="nvfp4")
    _, states, ref, _, oracle, errs = _run(family, cfg, "vk" if family != "mamba2" else "kv", steps=6)
    assert max(errs) < TOL["nvfp4"] and sum(errs) / len(errs) < TOL["nvfp4"] / 4
    for k in ref.read:
        assert torch.equal(states.pool.read[k][:, REAL_SLOTS], ref.read[k][:, REAL_SLOTS]), k
    for layer in range(NL):
        assert rms_ratio(states.read_state(layer, SLOTS)[REAL], oracle[layer]) < TOL["bfloat16"]


def _states(family="gdn", **cfg_kw):
    spec = SPECS[family]
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, **cfg_kw)
    return ReplayMambaStates(spec, cfg, torch.zeros(NL, S, *spec.state_shape), backend="reference")


def test_accept_count_out_of_range_is_refused():
    states = _states()
    spec = SPECS["gdn"]
    gen = torch.Generator().manual_seed(1)
    slots = REAL_SLOTS
    for layer in range(NL):
        states.verify(layer, slots, **make_inputs(spec, Params(spec, NL, gen), layer, 3, 2, gen))
    meta = SimpleNamespace(num_contexts=0, num_seqs=3)
    with pytest.raises(ValueError, match=r"num_accepted: expected values in 1\.\.T"):
        states.update_mamba_states(meta, torch.tensor([1, 3, 1]), slots)
    with pytest.raises(ValueError, match="state_indices: expected a 1-d tensor of at least num_seqs=3"):
        states.update_mamba_states(meta, torch.tensor([1, 2, 1]), slots[:2])


def test_repeated_slot_needs_padding_slots():
    states = _states()
    spec = SPECS["gdn"]
    gen = torch.Generator().manual_seed(2)
    inp = make_inputs(spec, Params(spec, NL, gen), 0, SLOTS.numel(), None, gen)
    with pytest.raises(ValueError, match="slots: expected distinct slot indices"):
        states.decode(0, SLOTS, **inp)
    with pytest.raises(ValueError, match=r"padding_slots: expected slot indices in \[0, 5\), got 5"):
        ReplayMambaStates(spec, rs.ReplayConfig(), torch.zeros(NL, S, *spec.state_shape), padding_slots=(5,))
    with pytest.raises(ValueError, match="state_indices: expected a 1-d int tensor, got torch.float32"):
        states.decode(0, SLOTS.float(), **inp)


def test_conv_window_commit_copies_the_accepted_windows_without_host_reads():
    """TRT-LLM's conv-state commit: each generation row's window after its accepted tokens becomes its
    slot's conv state in every layer; context rows in front are skipped; no device value is read."""
    gen = torch.Generator().manual_seed(3)
    conv = torch.randn(NL, S, 6, 3, generator=gen)
    window = torch.randn(NL, S, 3, 6, 3, generator=gen)              # [layers, rows, T, conv_dim, width - 1]
    before = conv.clone()
    meta = SimpleNamespace(num_contexts=1, num_seqs=4)
    slots, accepted = torch.tensor([0, 3, 1, 4]), torch.tensor([9, 2, 3, 1])
    with HostReads() as mode:
        commit_conv_windows(conv, window, meta, accepted, slots, torch.arange(S, dtype=torch.int32))
    assert mode.found == []
    for row, (slot, acc) in enumerate(zip(slots[1:].tolist(), accepted[1:].tolist())):
        assert torch.equal(conv[:, slot], window[:, row, acc - 1])
    for slot in (0, 2):                                            # the context row's slot and an unused one
        assert torch.equal(conv[:, slot], before[:, slot])


def test_commit_without_generation_rows_is_a_no_op():
    states = _states()
    before = {k: v.clone() for k, v in states.pool.cursors.items()}
    states.update_mamba_states(SimpleNamespace(num_contexts=2, num_seqs=2), torch.tensor([5, 5]), torch.tensor([0, 1]))
    assert all(torch.equal(before[k], states.pool.cursors[k]) for k in before)


def test_state_tensor_is_checked():
    spec = SPECS["mamba2"]
    cfg = rs.ReplayConfig(window=4)
    with pytest.raises(ValueError, match="ssm_states: expected TRT-LLM's temporal state tensor"):
        ReplayMambaStates(spec, cfg, torch.zeros(S, *spec.state_shape))
    with pytest.raises(TypeError, match="checkpoint: expected dtype torch.float32"):
        ReplayMambaStates(spec, cfg, torch.zeros(NL, S, *spec.state_shape, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="layer: expected an int in"):
        ReplayMambaStates(spec, cfg, torch.zeros(NL, S, *spec.state_shape)).get_ssm_states(NL)


def test_cache_manager_class_says_what_to_install(monkeypatch):
    for m in ("tensorrt_llm", "tensorrt_llm._torch", "tensorrt_llm._torch.pyexecutor"):
        monkeypatch.setitem(sys.modules, m, None)
    with pytest.raises(ImportError, match=r"TensorRT-LLM 1\.2\.x is required: pip install tensorrt-llm==1\.2\.1"):
        cache_manager_class()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_decode_is_captured_in_a_cuda_graph():
    """TRT-LLM captures its decode steps in CUDA graphs: a GDN decode of ReplayMambaStates (Triton
    backend, NVFP4 read copy, TRT-LLM's padding slot in the batch) captured once and replayed through
    a flush equals the same steps run eagerly."""
    spec = SPECS["gdn"]
    cfg = rs.ReplayConfig(window=4, read_format="nvfp4")
    gen = torch.Generator().manual_seed(13)
    init = torch.randn(NL, S, spec.num_v_heads, spec.head_v_dim, spec.head_k_dim, generator=gen).cuda() * 0.1
    eager, graphed = (ReplayMambaStates(spec, cfg, init.clone(), state_layout="vk", backend="triton",
                                        padding_slots=PAD) for _ in range(2))
    slots = SLOTS.cuda()
    for states in (eager, graphed):
        states.refresh(slots)
    params = Params(spec, NL, gen)
    inp = make_inputs(spec, params, 0, SLOTS.numel(), None, gen, device="cuda")
    static = {k: v.clone() for k, v in inp.items()}
    out = torch.empty(SLOTS.numel(), spec.num_v_heads, spec.head_v_dim, device="cuda")
    graphed.decode(0, slots, out=out, **static)                    # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed.decode(0, slots, out=out, **static)
    eager.decode(0, slots, **inp)                                  # the capture itself ran nothing
    for _ in range(6):
        nxt = make_inputs(spec, params, 0, SLOTS.numel(), None, gen, device="cuda")
        for k, v in nxt.items():
            static[k].copy_(v)
        graph.replay()
        assert torch.equal(out, eager.decode(0, slots, **nxt))
    for name in eager.pool.ring:
        assert torch.equal(eager.pool.ring[name], graphed.pool.ring[name]), name
    assert torch.equal(eager.pool.cursors["count"], graphed.pool.cursors["count"])
    assert torch.equal(eager.ssm_states, graphed.ssm_states)
