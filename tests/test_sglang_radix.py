"""A request's replay state through SGLang 0.5.23's own radix cache (UnifiedRadixCache + MambaComponent,
no_buffer) on the CPU (or the GPU: ``REPLAYSSM_TEST_DEVICE=cuda``): alloc, clear, prefill, decode, finish
(donate to the tree), match with copy-on-write into a new request, decode on, free. Checked against the fp64
step recurrence.
"""

from array import array

import pytest
import torch

pytest.importorskip("sglang")

from conftest import DEVICE  # noqa: E402
from helpers import TOL, rms_ratio  # noqa: E402
from test_sglang_replay import LAYERS, Run, _req_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("test_device")


def _radix_cache(req_pool):
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    kv = TokenToKVPoolAllocator(size=64, dtype=torch.float32, device=DEVICE, kvcache=None, need_sort=False)
    return UnifiedRadixCache(CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=kv,
                                             page_size=1, tree_components=(ComponentType.FULL, ComponentType.MAMBA)))


def _admit(cache, req_pool, rid, tokens):
    """What the scheduler does for a new request: match (COW on a hit), take rows and KV slots."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=32))
    hit = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)), req=req, cow_mamba=True))
    assert req_pool.alloc([req]) is not None
    req.last_node = hit.last_device_node
    n = len(tokens) + 16
    req_pool.write((req.kv.req_pool_idx, slice(0, n)), cache.token_to_kv_pool_allocator.alloc(n).to(torch.int32))
    return req, hit


def _forward_prep(req_pool, req):
    """ModelRunner's deferred slot work before the extend: COW copy or clear."""
    slot = req.kv.mamba_pool_idx.view(1)
    if req.kv.mamba_cow_src_index is not None:
        req_pool.copy_mamba_state(req.kv.mamba_cow_src_index.view(1), slot)
        req.kv.mamba_cow_src_index = None
    elif req.kv.mamba_needs_clear:
        req_pool.mamba_pool.clear_slots(slot)
        req.kv.mamba_needs_clear = False
    return slot


def _prefilled(req_pool, run, req):
    """``req``'s slot after ModelRunner's slot work and its prefill, the twin refreshed alike."""
    slot = _forward_prep(req_pool, req)
    run.twin.refresh(slot)
    run.prefill(slot)
    return slot


def _decode(run, req, slot, tokens):
    """``tokens`` decode steps on ``slot``, each within tolerance of the recurrence, recorded as ``req``'s output."""
    for token in tokens:
        assert run.decode(slot) < TOL["fp8"]
        req.output_ids.append(token)


def _finish(cache, req, prompt_len):
    """``req`` finishes after its output: SGLang donates its slot to the tree."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    req.refresh_fill_ids()
    cache.checkpoint(req, up_to=prompt_len + len(req.output_ids))


def test_state_through_sglangs_radix_cache_matches_step_recurrence(server_args, replay_on):
    req_pool = _req_pool()
    cache = _radix_cache(req_pool)
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(7))
    prompt = list(range(10, 18))
    a, hit = _admit(cache, req_pool, "a", prompt)
    assert hit.device_prefix_len == 0 and req_pool.mamba_pool.replay.allocated.all()
    slot_a = _prefilled(req_pool, run, a)
    _decode(run, a, slot_a, range(40, 46))                       # window 4: the ring holds 2 tokens at the end
    assert req_pool.mamba_pool.replay.cursors["count"][:, slot_a].eq(2).all()
    want = [run.oracle[layer, slot_a.item()].clone() for layer in range(len(LAYERS))]

    _finish(cache, a, len(prompt))                                # the finished slot is donated to the tree
    # pending until the next reader: its ring still holds the 2 tokens
    assert req_pool.mamba_pool.replay.cursors["count"][:, slot_a].eq(2).all()

    b, hit = _admit(cache, req_pool, "b", prompt + [40 + t for t in range(6)] + [90, 91])
    assert hit.device_prefix_len == len(prompt) + 6
    assert int(b.kv.mamba_cow_src_index) == int(slot_a[0]) and int(b.kv.mamba_pool_idx) != int(slot_a[0])
    slot_b = _forward_prep(req_pool, b)                           # COW copy of the tree's checkpoint
    # the copy flushed the donation first: the tree holds the whole state at token 14
    assert req_pool.mamba_pool.replay.cursors["count"][:, slot_a].eq(0).all()
    for layer in range(len(LAYERS)):
        assert rms_ratio(req_pool.mamba_pool.mamba_cache.temporal[layer, slot_a[0]], want[layer]) < TOL["float32"]
    assert req_pool.mamba_pool.replay.cursors["count"][:, slot_b].eq(0).all()
    run.adopt(slot_b, torch.stack(want)[:, None])
    for _ in range(5):                                            # b decodes on from a's state
        assert run.decode(slot_b) < TOL["fp8"]
    assert run.state_error(slot_b) < TOL["float32"]
    for layer in range(len(LAYERS)):                              # the tree's copy is untouched
        assert rms_ratio(req_pool.mamba_pool.mamba_cache.temporal[layer, slot_a[0]], want[layer]) < TOL["float32"]
    free_before = req_pool.mamba_allocator.available_size()
    req_pool.free_mamba_cache(b)
    assert req_pool.mamba_allocator.available_size() == free_before + 1


def test_a_cache_flush_drops_the_tree_and_the_next_request_on_its_slot_starts_clean(server_args, replay_on):
    """SGLang's /flush_cache (``Scheduler.flush_cache``: the tree reset, then ``HybridReqToTokenPool.clear``)
    with a finished request's donation still pending: the next request matches nothing, takes the same
    slot, and its clear flushes the pending ring before resetting it; its decode then follows the step
    recurrence from its own prefill."""
    req_pool = _req_pool()
    cache = _radix_cache(req_pool)
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(11))
    prompt = list(range(20, 29))
    a, _ = _admit(cache, req_pool, "a", prompt)
    slot_a = _prefilled(req_pool, run, a)
    _decode(run, a, slot_a, range(50, 57))                       # window 4: the ring holds 3 tokens at the end
    _finish(cache, a, len(prompt))
    mp = req_pool.mamba_pool
    assert mp.donations and mp.replay.cursors["count"][:, slot_a].eq(3).all()

    free = req_pool.mamba_allocator.available_size()
    cache.reset()
    req_pool.clear()
    assert req_pool.mamba_allocator.available_size() > free

    c, hit = _admit(cache, req_pool, "c", prompt + [50 + t for t in range(7)])
    assert hit.device_prefix_len == 0 and c.kv.mamba_cow_src_index is None
    assert int(c.kv.mamba_pool_idx) == int(slot_a[0])
    slot_c = _forward_prep(req_pool, c)                          # the clear: pending donation first, then reset
    assert not mp.donations and mp.replay.cursors["count"][:, slot_c].eq(0).all()
    run.twin.refresh(slot_c)
    run.prefill(slot_c)
    _decode(run, c, slot_c, range(60, 66))
    assert run.state_error(slot_c) < TOL["float32"]
