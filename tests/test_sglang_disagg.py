"""PD disaggregation, decode side, under replay on the CPU (or the GPU: ``REPLAYSSM_TEST_DEVICE=cuda``), through
SGLang 0.5.23's own decode-side objects: ``HybridMambaDecodeReqToTokenPool`` (the pool a decode server builds,
holding the replay pool), a slot whose previous request left tokens in its ring, the prefill server's state
written into that slot as its transfer does (bytes into ``temporal``), and ``ScheduleBatch.prepare_for_prebuilt``,
the batch that takes transferred requests to their first decode. Checked against the fp64 step recurrence.

The transfer engines themselves (Mooncake, NIXL, ...) are not run: they write the slot's bytes, which is what
the test does.
"""

from array import array

import pytest
import torch

pytest.importorskip("sglang")

from conftest import DEVICE  # noqa: E402
from helpers import TOL  # noqa: E402
from test_sglang_replay import (H, LAYERS, N, P, Run, _assert_read_copy_is_encoded_checkpoint,  # noqa: E402
                                _cache_params)

pytestmark = pytest.mark.usefixtures("test_device")


def _decode_pool():
    """A decode server's pool with one request row and so one mamba slot: the next request reuses it."""
    from sglang.srt.disaggregation.decode import HybridMambaDecodeReqToTokenPool

    return HybridMambaDecodeReqToTokenPool(size=1, max_context_len=64, device=DEVICE, enable_memory_saver=False,
                                           cache_params=_cache_params(), mamba_layer_ids=LAYERS,
                                           speculative_num_draft_tokens=None, enable_mamba_extra_buffer=False,
                                           pre_alloc_size=0, enable_overlap_schedule=False)


def _request(rid, tokens):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=16))


def test_transferred_state_is_what_the_first_decode_reads(server_args, replay_on):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    req_pool = _decode_pool()
    mp = req_pool.mamba_pool
    assert hasattr(mp, "replay")
    gen = torch.Generator().manual_seed(13)
    run = Run(req_pool, replay_on, gen)
    first = _request("first", list(range(10, 18)))
    assert req_pool.alloc([first]) is not None
    slot = first.kv.mamba_pool_idx.view(1)
    run.started(slot, 3)                                         # window 4: the ring holds 3 tokens
    req_pool.free_mamba_cache(first)
    req_pool.free(first)

    second = _request("second", list(range(20, 28)))
    assert req_pool.alloc([second]) is not None
    assert int(second.kv.mamba_pool_idx) == int(slot[0])
    assert mp.replay.cursors["count"][:, slot].eq(3).all()      # the previous request's ring
    sent = torch.randn(len(LAYERS), H, P, N, generator=gen) * 0.3
    mp.mamba_cache.temporal[:, slot[0]] = sent.to(DEVICE)         # the prefill server's state, as a transfer writes it

    kv = TokenToKVPoolAllocator(size=64, dtype=torch.float32, device=DEVICE, kvcache=None, need_sort=False)
    n = len(second.origin_input_ids)
    req_pool.write((second.kv.req_pool_idx, slice(0, n)), kv.alloc(n).to(torch.int32))
    second.output_ids.append(7)                                  # the prefill server's first token
    second.init_next_round_input(None)                           # what the decode scheduler does before the batch
    second.kv.kv_committed_len = n
    second.extend_end = second.kv.kv_committed_len
    batch = ScheduleBatch.init_new([second], req_pool, kv, None, ModelConfig.from_server_args(server_args), False,
                                   SpeculativeAlgorithm.NONE)
    batch.prepare_for_prebuilt()
    assert batch.forward_mode == ForwardMode.PREBUILT
    assert mp.replay.cursors["count"][:, slot].eq(0).all()
    _assert_read_copy_is_encoded_checkpoint(mp, slot)

    run.adopt(slot, sent[:, None])
    assert run.state_error(slot) < TOL["float32"]
    for _ in range(5):                                           # the first decodes, through a flush
        assert run.decode(slot) < TOL["fp8"]
    assert run.state_error(slot) < TOL["float32"]
