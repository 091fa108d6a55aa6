"""replayssm kernels: one folder per op family, each a PyTorch reference beside its Triton kernel.

``warmup`` compiles the kernel variants a configuration uses before serving starts (the first
launch of each variant is otherwise compiled on first use, and logged on the ``replayssm`` logger).
"""


def warmup(spec, cfg, device="cuda", tokens=(1,)) -> int:
    """Compile (by running once on a scratch pool) the step kernels for ``tokens`` per step.

    Args:
        spec: ``replayssm.LayerSpec``. cfg: ``replayssm.ReplayConfig``. device: where to run.
        tokens: step sizes to compile: 1 is decode, T > 1 a verify of T tokens.
    Returns:
        The number of steps run.
    """
    import torch

    import replayssm as rs

    pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=1, device=device, backend="triton")
    slots = pool.alloc(1)
    dev = pool.device
    act = cfg.torch_ring_dtype
    steps = 0
    for T in tokens:
        lead = (1,) if T == 1 else (1, T)
        if spec.family == "mamba2":
            H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
            inp = dict(x=torch.zeros(*lead, H, P, dtype=act, device=dev), dt=torch.zeros(*lead, H, device=dev),
                       A=-torch.ones(H, device=dev), B=torch.zeros(*lead, G, N, dtype=act, device=dev),
                       C=torch.zeros(*lead, G, N, dtype=act, device=dev), D=torch.ones(H, device=dev),
                       dt_bias=torch.zeros(H, device=dev), z=torch.zeros(*lead, H, P, dtype=act, device=dev))
        else:
            HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
            g = (*lead, HV) if spec.family == "gdn" else (*lead, HV, K)
            inp = dict(q=torch.zeros(*lead, HK, K, device=dev), k=torch.zeros(*lead, HK, K, dtype=act, device=dev),
                       v=torch.zeros(*lead, HV, V, dtype=act, device=dev), g=torch.zeros(g, device=dev),
                       beta=torch.zeros(*lead, HV, device=dev))
        if T == 1:
            rs.decode(pool, 0, slots, **inp)
        else:
            rs.verify(pool, 0, slots, **inp)
            pool.commit(slots, torch.ones(1, dtype=torch.int64))
        steps += 1
    return steps
