"""A request's replay state through SGLang 0.5.23's extra_buffer radix flow, on the CPU (or the GPU:
``REPLAYSSM_TEST_DEVICE=cuda``): the request's ping-pong track slot from ``HybridReqToTokenPool.alloc``,
the decode track indices from ``set_mamba_track_indices_from_reqs``, the track copy
(``track_mamba_states_all_layers``), the result processor's track bookkeeping
(``SchedulerBatchResultProcessor._mamba_prefix_cache_update``), the finished request's track slot
donated to ``UnifiedRadixCache``, a match with copy-on-write into a new request, decode on, free.
With speculative decoding: verifies committed through SGLang's ``commit_mamba_states_after_verify``,
whose interval-crossing step moves the track slot. Checked against the fp64 step recurrence.

SGLang resolves ``--mamba-radix-cache-strategy extra_buffer`` only on GPU platforms; on the CPU the
test replaces that one platform predicate (``mamba_hook._platform_supports_mamba_cache_extra_buffer``)
so SGLang's server arguments resolve as they do on a GPU. The scheduler's decode loop (which step
tracks, the sequence counters) is the test's own, written from ``ScheduleBatch.prepare_for_decode``
(a step tracks when the sequence length is a multiple of ``mamba_track_grid``), as are the three
track fields ``_handle_finish_state_updated_req`` sets on a completed boundary.
"""

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch

import replayssm as rs

pytest.importorskip("sglang")

from conftest import DEVICE, TINY_NEMOTRON_H  # noqa: E402
from helpers import TOL, f64, rms_ratio, step_oracle, token  # noqa: E402
from test_sglang_radix import _admit, _forward_prep  # noqa: E402
from test_sglang_replay import LAYERS, SPEC, Run, _cache_params  # noqa: E402
from test_unchecked import HostReads, _buffers  # noqa: E402

pytestmark = pytest.mark.usefixtures("test_device")
INTERVAL = 8                        # --mamba-track-interval (the tiny model's chunk size is 8 too)


@contextlib.contextmanager
def _resolved_args(server_args, tmp_path, monkeypatch, overlap):
    """SGLang's process-wide server arguments resolved for extra_buffer (with the overlap scheduler
    when ``overlap``); the ``server_args`` fixture's after."""
    from sglang.srt.arg_groups import mamba_hook
    from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_scheduler

    monkeypatch.setattr(mamba_hook, "_platform_supports_mamba_cache_extra_buffer", lambda: True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text(json.dumps(TINY_NEMOTRON_H))
    args = prepare_server_args(["--model-path", str(tmp_path), "--device", DEVICE, "--skip-tokenizer-init",
                                "--mamba-radix-cache-strategy", "extra_buffer", "--mamba-track-interval",
                                str(INTERVAL), *([] if overlap else ["--disable-overlap-schedule"])])
    set_global_server_args_for_scheduler(args)
    yield args
    set_global_server_args_for_scheduler(server_args)


@pytest.fixture
def extra_buffer_args(server_args, tmp_path, monkeypatch):
    with _resolved_args(server_args, tmp_path, monkeypatch, overlap=False) as args:
        yield args


@pytest.fixture(params=[False, True], ids=["one-track-slot", "overlap-ping-pong"])
def track_args(request, server_args, tmp_path, monkeypatch):
    """extra_buffer without the overlap scheduler (one track slot per request) and with it (two
    ping-pong track slots, the next boundary's track written to the other one)."""
    with _resolved_args(server_args, tmp_path, monkeypatch, overlap=request.param) as args:
        yield request.param, args


def _pools(draft_tokens=None, overlap=False):
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    req_pool = HybridReqToTokenPool(size=8, mamba_size=10, mamba_spec_state_size=8, max_context_len=64, device=DEVICE,
                                    enable_memory_saver=False, cache_params=_cache_params(), mamba_layer_ids=LAYERS,
                                    enable_mamba_extra_buffer=True, enable_overlap_schedule=overlap,
                                    speculative_num_draft_tokens=draft_tokens)
    kv = TokenToKVPoolAllocator(size=64, dtype=torch.float32, device=DEVICE, kvcache=None, need_sort=False)
    cache = UnifiedRadixCache(CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=kv,
                                              page_size=1, enable_mamba_extra_buffer=True,
                                              tree_components=(ComponentType.FULL, ComponentType.MAMBA)))
    return req_pool, cache


def _decode_step(run, cache, req, slot, token):
    """One decode step of ``req`` as the scheduler runs it: the forward (the track copy on a
    boundary, after the step's state update), then the result: the token, the committed length
    and, on a boundary, SGLang's track bookkeeping. Returns whether the step tracked."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab
    from sglang.srt.managers.schedule_batch import set_mamba_track_indices_from_reqs
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
    from sglang.srt.runtime_context import mamba_track_grid

    mp = run.req_pool.mamba_pool
    seq_len = req.kv.kv_committed_len + 1                 # the batch's seq_lens: this step's token included
    boundary = seq_len % mamba_track_grid(cache.page_size) == 0
    batch = SimpleNamespace(reqs=[req], req_to_token_pool=run.req_pool,
                            req_pool_indices=torch.tensor([req.kv.req_pool_idx], device=DEVICE))
    set_mamba_track_indices_from_reqs(batch)
    assert run.decode(slot) < TOL["fp8"]
    if boundary:
        mask = torch.ones(1, dtype=torch.bool, device=DEVICE)
        with HostReads() as reads:
            hlab.track_mamba_states_all_layers(mp.mamba_cache.conv[0], mp.mamba_cache.temporal, slot, mask,
                                               batch.mamba_track_indices, 1)
        # the reference backend reads the mask on the host; the Triton backend's copy is graph-safe
        assert bool(reads.found) == (mp.replay.backend == "reference"), reads.found
        for layer in range(len(LAYERS)):
            run.oracle[layer, int(batch.mamba_track_indices[0])] = run.oracle[layer, int(slot[0])].clone()
    req.output_ids.append(token)
    req.kv.kv_committed_len = seq_len
    if boundary:
        # _handle_finish_state_updated_req on a completed boundary (not lazy, no overlap lookahead) ...
        req.kv.mamba_last_track_idx = batch.mamba_track_buffer_indices[0]
        req.kv.mamba_prev_track_seqlen = req.kv.mamba_last_track_seqlen
        req.kv.mamba_last_track_seqlen = req.kv.kv_committed_len
        # ... then SGLang's own ping-pong update
        processor = SimpleNamespace(tree_cache=cache, _mamba_assert_committed_len_lookahead=(
            SchedulerBatchResultProcessor._mamba_assert_committed_len_lookahead))
        SchedulerBatchResultProcessor._mamba_prefix_cache_update(processor, req, batch, None, 0, known_boundary=True)
    return boundary


@pytest.fixture(params=["reference", "triton"])
def replay_backend(request):
    """replayssm's SGLang hooks as ``replay_on`` installs them, on each StatePool backend (the Triton
    kernels in Triton's interpreter on a CPU)."""
    from replayssm.integrations.sglang import hooks
    cfg = rs.ReplayConfig(window=4, read_format="fp8", ring_dtype="float32")
    hooks.install(cfg, backend=request.param)
    yield cfg, request.param
    hooks.uninstall()


def test_track_slot_enters_the_tree_and_serves_a_match(track_args, replay_backend):
    """With the overlap scheduler SGLang gives a request two ping-pong track slots and writes each
    boundary to the other one; its lookahead (the next step launched before a step's result is
    processed) is not re-enacted here: every call runs in stream order, which is what replay's
    hooks rely on (the served check with the overlap scheduler runs it in SGLang's server)."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    replay_on, backend = replay_backend
    overlap, _ = track_args
    req_pool, cache = _pools(overlap=overlap)
    mp = req_pool.mamba_pool
    assert mp.replay.backend == backend
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(9))
    prompt = list(range(10, 16))                          # 6 tokens: decode tracks at 8 and 16
    a, hit = _admit(cache, req_pool, "a", prompt)
    assert hit.device_prefix_len == 0 and a.kv.mamba_ping_pong_track_buffer.numel() == (2 if overlap else 1)
    slots = a.kv.mamba_ping_pong_track_buffer.clone()
    slot_a = _forward_prep(req_pool, a)
    run.twin.refresh(slot_a)
    run.prefill(slot_a)
    a.output_ids.append(40)                               # the prefill's token
    a.kv.kv_committed_len = len(prompt)
    tracked = [len(prompt) + 1 + t for t in range(12) if _decode_step(run, cache, a, slot_a, 41 + t)]
    assert tracked == [8, 16] and a.kv.mamba_last_track_seqlen == 16
    track = slots[-1:]                                    # token 8 went to the first slot, 16 to the last
    assert int(a.kv.mamba_ping_pong_track_buffer[a.kv.mamba_last_track_idx]) == int(track[0])
    want = [run.oracle[layer, int(track[0])].clone() for layer in range(len(LAYERS))]
    assert run.state_error(track) < TOL["float32"]        # the state at token 16
    assert mp.replay.cursors["count"][:, track].gt(0).all()   # the track copy carried the ring, folding nothing
    assert run.state_error(slot_a) < TOL["float32"]       # the request's own slot decoded on from its ring
    # a row the mask leaves out (with a padded row beside it): nothing is flushed, copied or re-derived
    before = _buffers(mp.replay)
    rows = torch.cat((slot_a, torch.full_like(slot_a, -1)))
    hlab.track_mamba_states_all_layers(mp.mamba_cache.conv[0], mp.mamba_cache.temporal, rows,
                                       torch.zeros(2, dtype=torch.bool, device=DEVICE),
                                       torch.cat((track, track)).to(DEVICE), 2)
    after = _buffers(mp.replay)
    for name in before:                                   # the cursors' padding column absorbs padded rows
        keep = slice(None, -mp.replay.cursors[name[8:]].element_size()) if name.startswith("cursors.") else slice(None)
        assert torch.equal(before[name][..., keep], after[name][..., keep]), name

    a.finished_reason = FINISH_LENGTH(length=13)
    a.refresh_fill_ids()
    cache.checkpoint(a, up_to=a.kv.kv_committed_len)      # the track slot is donated: the key ends at 16
    assert mp.replay.cursors["count"][:, track].gt(0).all()   # pending until the next reader

    b, hit = _admit(cache, req_pool, "b", prompt + list(a.output_ids[:10]) + [90, 91])
    assert hit.device_prefix_len == 16 and int(b.kv.mamba_cow_src_index) == int(track[0])
    slot_b = _forward_prep(req_pool, b)                   # copy-on-write of the tree's track slot
    assert mp.replay.cursors["count"][:, track].eq(0).all()   # flushed before the copy read it
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.mamba_cache.temporal[layer, track[0]], want[layer]) < TOL["float32"]
    assert mp.replay.cursors["count"][:, slot_b].eq(0).all()
    run.adopt(slot_b, torch.stack(want)[:, None])
    for _ in range(5):                                    # b decodes on from a's tracked state
        assert run.decode(slot_b) < TOL["fp8"]
    assert run.state_error(slot_b) < TOL["float32"]
    for layer in range(len(LAYERS)):                      # the tree's copy is untouched
        assert rms_ratio(mp.mamba_cache.temporal[layer, track[0]], want[layer]) < TOL["float32"]
    free_before = req_pool.mamba_allocator.available_size()
    req_pool.free_mamba_cache(b)
    # b's own slot and its track slot (one without the overlap scheduler) come back
    assert req_pool.mamba_allocator.available_size() == free_before + 1 + req_pool.mamba_initial_tracking_slots


def test_verify_commits_track_the_interval_crossing_state(extra_buffer_args, replay_backend, monkeypatch):
    """extra_buffer with speculative decoding: chains of T = 3 drafts verified and committed through
    SGLang's ``commit_mamba_states_after_verify``, which picks the step where the accepted tokens
    cross a track interval (``_verify_commit_step_indices``) and calls the backend's commit (replay's
    hook): the track slot then holds the whole state at the interval's last token, flushed. On the
    Triton backend replay's track commit reads no device value, at a crossing or not."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.schedule_batch import set_mamba_track_indices_from_reqs
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    from sglang.srt.speculative.spec_utils import commit_mamba_states_after_verify
    from test_sglang_replay import _backends

    from replayssm.integrations.sglang import mamba2
    replay_on, backend = replay_backend
    watched, commit_track = [], mamba2.commit_track

    def commit_watched(*args):
        with HostReads() as reads:
            commit_track(*args)
        watched.append(reads.found)
    monkeypatch.setattr(mamba2, "commit_track", commit_watched)
    req_pool, cache = _pools(draft_tokens=3)
    mp = req_pool.mamba_pool
    assert mp.replay.backend == backend
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(10))
    model_config = ModelConfig.from_server_args(extra_buffer_args)
    attn, _ = _backends(req_pool, extra_buffer_args, model_config)
    worker = SimpleNamespace(model_runner=SimpleNamespace(model_config=model_config, req_to_token_pool=req_pool,
                                                          attn_backend=attn, model=None))
    a, _ = _admit(cache, req_pool, "a", list(range(10, 16)))
    track = int(a.kv.mamba_ping_pong_track_buffer[0])
    slot = _forward_prep(req_pool, a)
    run.twin.refresh(slot)
    run.prefill(slot)
    seq_len, tracked = 6, []
    for accepted in (2, 3, 1, 3, 3, 2, 3):
        err, kept = run.verify(slot, 3)
        assert err < TOL["fp8"], err
        crossing = (seq_len + accepted) // INTERVAL * INTERVAL
        step = crossing - seq_len - 1 if crossing > seq_len else -1     # the verify step at the interval's end
        want = []
        for layer, inp in enumerate(kept):
            S = run.oracle[layer, int(slot[0])][None]
            for t in range(step + 1):
                _, S = step_oracle(SPEC, S, f64(token(inp, t)))
            want.append(S[0])
        batch = SimpleNamespace(reqs=[a], req_to_token_pool=req_pool, forward_mode=SimpleNamespace(is_idle=lambda: False),
                                req_pool_indices=torch.tensor([a.kv.req_pool_idx], device=DEVICE),
                                seq_lens=torch.tensor([seq_len], device=DEVICE), tree_cache=cache)
        set_mamba_track_indices_from_reqs(batch)
        assert int(batch.mamba_track_indices[0]) == track
        attn.linear_attn_backend.forward_metadata = ForwardMetadata(
            query_start_loc=torch.tensor([0, 3], dtype=torch.int32, device=DEVICE),
            mamba_cache_indices=slot.to(torch.int32))
        accept_index = torch.tensor([[t if t < accepted else -1 for t in range(3)]], device=DEVICE)
        commit_mamba_states_after_verify(worker, batch, torch.tensor([accepted], device=DEVICE), accept_index, 3)
        if step >= 0:
            tracked.append(crossing)
            run.twin.copy(slot, torch.tensor([track], device=DEVICE))
            run.twin.commit(torch.tensor([track], device=DEVICE), torch.tensor([step + 1]))
            run.twin.flush(torch.tensor([track], device=DEVICE))
            assert mp.replay.cursors["count"][:, track].eq(0).all()
            for layer in range(len(LAYERS)):
                assert rms_ratio(mp.mamba_cache.temporal[layer, track], want[layer]) < TOL["float32"]
        run.twin.commit(slot, torch.tensor([accepted]))
        run.accept_oracle(slot, torch.tensor([accepted]), kept)
        seq_len += accepted
    assert tracked == [8, 16] and seq_len == 23
    assert len(watched) == 7                               # every verify's commit, a crossing or not
    if backend == "triton":
        assert watched == [[]] * 7, watched
    assert run.state_error(slot) < TOL["float32"]
    run.assert_ring_matches_twin()
