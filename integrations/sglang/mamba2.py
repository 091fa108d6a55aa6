"""Mamba-2 routing: SGLang's ``selective_state_update`` call sites in ``MambaMixer2.forward``, and
the commit after speculative acceptance.

``MambaMixer2`` (sglang 0.5.17 and 0.5.23, ``layers/attention/mamba/mamba.py``) calls, per layer:

- decode: ``selective_state_update(ssm_state, x [n, H, P], dt [n, H, P], A [H, P, N], B [n, G, N],
  C [n, G, N], D [H, P], z=None, dt_bias=[H, P], dt_softplus=True, state_batch_indices [n],
  out=[n, H, P])`` where dt, A, D and dt_bias are per-head values broadcast (stride 0) over P, N;
- verify: the same with a token axis (``x [n, T, H, P]``, ``out [n, T, H, P]``, ...) and
  ``disable_state_update=True, intermediate_states_buffer, cache_steps=T, ...``.

``replay_selective_state_update`` takes exactly those arguments and runs ``replayssm.decode`` /
``replayssm.verify`` on the layer's ``ReplayMambaPool`` state: the verify appends the drafts to the
ring and writes no per-draft state (``intermediate_states_buffer`` stays untouched); the commit
moves the cursors by the accepted count (``commit_after_verify``).
"""

from __future__ import annotations

import torch

import replayssm

from ..selective_state_update import step_inputs
from . import pool as replay_pool
from . import versions


def replay_selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                  state_batch_indices=None, pad_slot_id=-1, out=None, disable_state_update=False,
                                  intermediate_states_buffer=None, cache_steps=None, retrieve_parent_token=None,
                                  intermediate_state_indices=None, enable_stochastic_rounding=False,
                                  cache_philox_rounds=0):
    """One Mamba-2 decode (or verify) step of a replay layer, with ``selective_state_update``'s arguments.

    Args:
        state: one layer of a ``ReplayMambaPool``'s ``temporal``, ``[size + 1, H, P, N]``: the
            replay checkpoint, read and (at a flush) written in place.
        x: ``[n, H, P]`` (decode) or ``[n, T, H, P]`` (verify), the ring dtype.
        dt: like x, per-head values broadcast over P (raw, before ``dt_bias`` and softplus).
        A: ``[H, P, N]`` fp32, per-head values broadcast over P, N.
        B, C: ``[n, G, N]`` or ``[n, T, G, N]``; B in the ring dtype.
        D, dt_bias: ``[H, P]`` broadcast over P, or None. z: like x, or None.
        dt_softplus: must be True. state_batch_indices: int32/int64 ``[n]`` pool slots, -1 = padding.
        pad_slot_id: must be -1. out: like x, x's dtype, written in place (required).
        disable_state_update: True for a verify (x has a token axis), False for a decode.
        cache_steps: T of a verify, or None. intermediate_states_buffer, intermediate_state_indices:
            SGLang's per-draft snapshots; replay keeps none, so they are not read.
            retrieve_parent_token: a draft tree's links, refused (replay verifies a chain).
        enable_stochastic_rounding, cache_philox_rounds: must be off; the replay checkpoint dtype
            ``float16_sr`` does its own stochastic rounding.
    Returns:
        ``out``.
    """
    found = replay_pool.lookup(state)
    if found is None:
        raise ValueError("state: not a layer of a ReplayMambaPool's temporal tensor; with replay on every Mamba-2 "
                         "state must come from HybridReqToTokenPool.mamba_pool_cls (other pool classes are not served)")
    owner, layer = found
    if pad_slot_id != -1:
        raise ValueError(f"pad_slot_id: expected -1 (replayssm's padded row), got {pad_slot_id!r}")
    if enable_stochastic_rounding or cache_philox_rounds:
        raise ValueError("enable_stochastic_rounding: SGLang's stochastic rounding cannot run under replay; use "
                         "--replay-checkpoint-dtype float16_sr")
    replay_pool.chain_only(retrieve_parent_token)
    is_verify, inputs = step_inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus=dt_softplus,
                                    state_batch_indices=state_batch_indices, out=out,
                                    disable_state_update=disable_state_update, cache_steps=cache_steps)
    slots = replay_pool.replay_slots(owner.replay, state_batch_indices)
    step = replayssm.verify if is_verify else replayssm.decode
    return step(owner.replay, layer, slots, out=out, checked=replay_pool.checked(owner.replay), **inputs)


def commit_after_verify(backend, last_correct_step_indices: torch.Tensor, mamba_track_indices,
                        mamba_steps_to_track=None, req_pool_indices=None) -> bool:
    """Replay's commit in place of SGLang's ``intermediate_ssm`` scatter; False when the pool is not replay.

    ``backend`` is SGLang's ``HybridLinearAttnBackend``; ``last_correct_step_indices`` int ``[bs]``
    (accepted tokens - 1, the bonus token counted). The conv windows (and SGLang's per-slot side
    states) roll back as in SGLang; the ssm side keeps the first ``last_correct_step_indices + 1``
    verified tokens of every layer by moving the cursors (``StatePool.commit``).

    extra_buffer: ``mamba_track_indices`` (virtual track slots ``[bs]``) and ``mamba_steps_to_track``
    (``[bs]``, the verify step whose state a row's track slot takes, -1 for none): ``commit_track``;
    the track slot's conv window is SGLang's scatter.
    """
    seams = versions.seams()
    linear = backend.linear_attn_backend
    req_pool = linear.req_to_token_pool
    owner = req_pool.mamba_pool
    if not hasattr(owner, "replay"):
        return False
    if (mamba_track_indices is None) != (mamba_steps_to_track is None):
        raise ValueError("mamba_steps_to_track: expected it exactly with mamba_track_indices (extra_buffer)")
    n = last_correct_step_indices.shape[0]
    slots, src_rows = seams.verify_slots(linear, req_pool, n, req_pool_indices)
    caches = req_pool.get_speculative_mamba2_params_all_layers()
    pool, ck = owner.replay, replay_pool.checked(owner.replay)
    scatters, track_args = [(slots, last_correct_step_indices)], (None, None)
    if mamba_track_indices is not None:
        track = linear._translate_mamba_indices(mamba_track_indices)
        track_args = (track, mamba_steps_to_track)
        scatters.append(track_args)
        commit_track(owner, replay_pool.replay_slots(pool, slots[:n]), replay_pool.replay_slots(pool, track[:n]),
                     mamba_steps_to_track[:n])
    for conv, window in zip(caches.conv, caches.intermediate_conv_window):
        for dst_slots, dst_steps in scatters:
            seams.scatter_conv_window(conv, window, dst_slots, dst_steps, src_rows)
    seams.commit_side_states(backend, slots, last_correct_step_indices, track_args, src_rows)
    pool.commit(replay_pool.replay_slots(pool, slots), last_correct_step_indices + 1, checked=ck)
    return True


def commit_track(owner, slots: torch.Tensor, track: torch.Tensor, steps: torch.Tensor) -> None:
    """extra_buffer's verify track on ``owner`` (a ``ReplayMambaPool``), before the rows' own commit:
    the slot of each row with ``steps >= 0`` is copied into its track slot with the verify still
    pending (``StatePool.copy``, the checkpoint included), the copy keeps the first ``step + 1``
    tokens (commit) and is flushed, so the track slot holds the whole state at that token, as
    SGLang's scatter of ``intermediate_ssm[row, step]`` would.

    ``slots``, ``track``: int64 ``[n]`` pool slots; ``steps``: int ``[n]``, -1 for a row not tracked,
    which is a padded row of the copy, commit and flush. On the Triton backend nothing is read on the
    host (the flush replays from the pool's ``replay_graphs``)."""
    pool, ck = owner.replay, replay_pool.checked(owner.replay)
    steps = steps.to(device=pool.device, dtype=torch.int64)
    tracked = steps >= 0
    src, dst = (torch.where(tracked, rows, -1) for rows in (slots, track))
    pool.copy(src, dst, checked=ck)
    pool.commit(dst, torch.where(tracked, steps + 1, 0), checked=ck)
    replay_pool.on_event("verify track", owner, dst)
