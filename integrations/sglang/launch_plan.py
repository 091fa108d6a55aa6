"""The launcher's dry-run model checks: a model's replay plan as SGLang will serve it (``launch_server``).

``model_config`` loads the model's config the way SGLang's ``ModelConfig`` does (a local directory,
or the hub and its cache). ``replay_plan`` then finds the layers SGLang keeps a mamba state for and
their per-rank cache parameters (SGLang's own config classes, under a parallel context of these
server arguments: TP shards the heads), and applies the checks the plugin applies in the server:

| check | in the server |
|---|---|
| SSM / linear-attention layers of a family replay routes (Mamba-2, GDN, KDA) | ``pool.layer_spec``, ``hooks.check_linear_backend`` |
| dims the read format serves; on a GPU, dims the Triton kernels take | ``StatePool`` (``ReplayConfig.check``, ``kernels.backend.check``) |
| SGLang stores the model's ssm state in the replay checkpoint dtype | ``ReplayMambaPool.__init__`` |

Each refusal is a ``SystemExit`` naming the launcher flag. The plan: family, the attention TP width
(``attn_tp_size``), the per-rank dims, the state dtype, and every replayed layer with its bytes per
slot (checkpoint, read copy, ring, cursors: ``StatePool.bytes_per_slot`` plus the cursors), with
their sum over the layers; SGLang's conv windows per slot over the layers (``sglang_conv_bytes_per_slot``:
with the checkpoint, which is SGLang's own state tensor, what a slot of SGLang's mamba pool takes without
replay); with speculative decoding also the bytes of SGLang's per-token state snapshots per running
request (``intermediate_ssm``), which the replay pool does not allocate.
"""

from __future__ import annotations

import dataclasses
import math

from replayssm import ReplayConfig
from replayssm import backend as backends
from replayssm.pool import side_bytes_per_slot

_DIMS = {"mamba2": ("num_heads", "head_dim", "state_dim", "num_groups"),
         "gdn": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"),
         "kda": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")}


def model_config(server_args):
    """SGLang's ``ModelConfig`` of ``server_args`` (the model's config read as the server reads it);
    SystemExit naming ``--model-path`` when it cannot be loaded."""
    from sglang.srt.configs.model_config import ModelConfig

    try:
        return ModelConfig.from_server_args(server_args)
    except Exception as e:  # transformers / the hub raise OSError, ValueError, KeyError, ...
        raise SystemExit(f"--model-path: SGLang cannot load the config of {server_args.model_path!r} "
                         f"({type(e).__name__}: {e})") from None


def _family(model_cfg) -> tuple[str, object]:
    """``(family, the config holding the layers)`` of the linear layers SGLang serves in ``model_cfg``."""
    from sglang.srt.configs import hybrid_arch

    from . import versions

    for family, find in (("mamba2", hybrid_arch.mamba2_config), ("gdn", hybrid_arch.hybrid_gdn_config),
                         ("kda", getattr(hybrid_arch, versions.seams().kda_config_finder))):
        found = find(model_cfg)
        if found is not None:
            return family, found
    name = type(model_cfg.hf_config).__name__
    if hybrid_arch.mambaish_config(model_cfg) is not None:
        raise SystemExit(f"--replay-ssm: SGLang serves the linear layers of {name} with a backend replayssm does "
                         "not route (it routes Mamba-2, GDN and KDA layers); serve this model without --replay-ssm")
    raise SystemExit(f"--replay-ssm: {name} has no SSM / linear-attention layers SGLang keeps a mamba state for; "
                     "replay does not apply, serve it without --replay-ssm")


def _cache_params(server_args, holder):
    """The holder's per-rank ``mamba2_cache_params``, under SGLang's parallel context of ``server_args``."""
    from sglang.srt.runtime_context import get_parallel

    from . import versions

    try:
        with versions.seams().rank_context(server_args):
            return holder.mamba2_cache_params, get_parallel().attn_tp_size
    except Exception as e:  # a config SGLang's own classes cannot size a mamba pool from
        raise SystemExit(f"--model-path: SGLang cannot size the mamba state of {server_args.model_path!r} from its "
                         f"config ({type(e).__name__}: {e})") from None


def replay_plan(server_args, cfg: ReplayConfig, model_cfg=None) -> dict:
    """The replay plan of ``server_args``' model under ``cfg`` (module docstring), or SystemExit
    naming the flag whose value the server would refuse.

    ``model_cfg``: SGLang's ``ModelConfig`` (None: :func:`model_config`). The verify budget is
    SGLang's resolved ``speculative_num_draft_tokens`` when speculative decoding is on."""
    from . import pool

    model_cfg = model_config(server_args) if model_cfg is None else model_cfg
    family, holder = _family(model_cfg)
    params, tp = _cache_params(server_args, holder)
    try:
        spec = pool.layer_spec(params)
    except ValueError as e:
        raise SystemExit(f"--replay-ssm: {e}") from None
    if spec.family != family:
        raise SystemExit(f"--replay-ssm: SGLang serves these layers as {family} but their cache parameters "
                         f"describe {spec.family} layers; this model is not served with replay")
    drafts = getattr(server_args, "speculative_num_draft_tokens", None)
    if getattr(server_args, "speculative_algorithm", None) and drafts:
        cfg = dataclasses.replace(cfg, max_draft_tokens=drafts - 1)
    try:
        cfg.check(spec)
    except ValueError as e:
        raise SystemExit(f"--replay-read-format: {cfg.read_format} cannot serve this model's layers ({e})") from None
    backend = "triton" if getattr(server_args, "device", None) == "cuda" else "reference"
    try:
        backends.get(backend).check(spec, cfg)
    except ValueError as e:
        what = "the Triton kernels" if backend == "triton" else f"the {backend} backend"
        raise SystemExit(f"--replay-ssm: {what} do not take this model's layers ({e})") from None
    state_dtype = params.dtype.temporal
    if state_dtype != cfg.torch_checkpoint_dtype:
        raise SystemExit(f"--replay-checkpoint-dtype: SGLang stores this model's ssm state as {state_dtype} "
                         f"(--mamba-ssm-dtype, the config's mamba_ssm_dtype); checkpoint dtype {cfg.checkpoint_dtype} "
                         f"needs {cfg.torch_checkpoint_dtype}")
    side = side_bytes_per_slot(spec, cfg)
    per_layer = dict(checkpoint=spec.state_numel * cfg.torch_checkpoint_dtype.itemsize, read_copy=side["read_copy"],
                     ring=side["ring"], cursors=side["cursors"])
    dims = {k: getattr(spec, k) for k in _DIMS[spec.family]}
    layers = [dict(layer=i, family=spec.family, dims=dims, bytes_per_slot=per_layer) for i in params.layers]
    plan = dict(family=spec.family, attn_tp_size=tp, dims=dims, state_dtype=str(state_dtype).removeprefix("torch."),
                backend=backend, max_draft_tokens=cfg.max_draft_tokens, capacity=cfg.capacity, layers=layers,
                bytes_per_slot={k: v * len(layers) for k, v in per_layer.items()},
                total_bytes_per_slot=sum(per_layer.values()) * len(layers),
                sglang_conv_bytes_per_slot=sum(math.prod(c) for c in params.shape.conv) * params.dtype.conv.itemsize
                * len(layers))
    if cfg.max_draft_tokens:
        # SGLang's per-token state snapshots of a verify (intermediate_ssm), which the replay pool does not allocate
        plan["sglang_snapshot_bytes_per_request"] = (cfg.max_draft_tokens + 1) * per_layer["checkpoint"] * len(layers)
    return plan
