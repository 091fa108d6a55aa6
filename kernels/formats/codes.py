"""Format codes the kernels take (``READ_FMT``, ``CKPT_FMT``), defined once: by a config's format
name (``READ_CODES``, ``CKPT_CODES``) and by a name in code (``ReadCode.FP8``, ``CkptCode.BF16``).
Plain ints, importable without Triton; ``kernels/formats/triton.py`` makes the kernel constants of them."""


class ReadCode:
    """Read-copy format codes: none (the step reads the checkpoint), fp8 e4m3, NVFP4."""

    CHECKPOINT = 0
    FP8 = 1
    NVFP4 = 2


class CkptCode:
    """Checkpoint format codes: fp32, bf16, fp16 with stochastic rounding."""

    FP32 = 0
    BF16 = 1
    FP16_SR = 2


READ_CODES = {"checkpoint": ReadCode.CHECKPOINT, "fp8": ReadCode.FP8, "nvfp4": ReadCode.NVFP4}
CKPT_CODES = {"float32": CkptCode.FP32, "bfloat16": CkptCode.BF16, "float16_sr": CkptCode.FP16_SR}
