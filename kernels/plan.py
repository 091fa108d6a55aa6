"""The pass planner: the passes of one step (kernel, tile, grid, constexprs, warps) from the tile
table (``kernels/tiles.py``), and ``Launch``, one kernel launch, which the torch ops run
(``launch``) and the TensorRT AOT path compiles with the same arguments.

A step is the decode or verify pass and the flush pass (a decode or verify on the checkpoint is one
launch that folds its flush rows too; a flush-only launch, ``T = 0``, the flush pass alone). The
launches' runtime arguments and their checks are the custom ops' (``kernels/ops.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import triton

from replayssm.kernels.formats.codes import ReadCode
from replayssm.kernels.tiles import TILES

log = logging.getLogger("replayssm")
_compiled: set = set()

# codes per 32-bit word the decode kernels stream, by read-format code: NVFP4 moves as words of 8
# codes; the checkpoint and fp8 (bytes, decoded in place) move one value per element
_PER_WORD = {ReadCode.CHECKPOINT: 1, ReadCode.FP8: 1, ReadCode.NVFP4: 8}
# the verify kernel reads fp8 as words of 4 codes too (its tl.dot tiles take 16 words)
_PER_WORD_VERIFY = {ReadCode.CHECKPOINT: 1, ReadCode.FP8: 4, ReadCode.NVFP4: 8}
# rows of cursors a flush-pass program scans at a time for the step's flush rows
FLUSH_SCAN_ROWS = 128


def passes(family: str, T: int, cols: int, rows: int, kernels: tuple, const: dict,
           vk: bool = False) -> list[tuple]:
    """(kernel, rows per program, the grid's last dimension, constexprs, warps, is the flush pass,
    register cap or None) of the two passes of a step (of the flush pass alone for ``T = 0``: a flush-only launch,
    ``StatePool.flush`` on the device; of the decode or verify kernel alone for a step on the
    checkpoint, which folds its flush rows too, unless its tile says ``fold=False``). The grid is
    (row tiles, heads, last): ``"n"`` (a program per row) for the non-flush passes, ``ROW_PROGRAMS``
    programs sharing the flush rows for the flush pass.

    ``kernels``: (decode, verify, flush) Triton functions of the family; ``vk``: the checkpoint's
    key channels are contiguous (a framework's ``[S, HV, V, K]`` tensor), which has its own decode
    and flush tiles, and behind a read copy its own replay tiles (``flush_replay_vk``,
    ``verify_flush_vk``: the flush passes, the only ones that read the checkpoint there)."""
    tiles = {**TILES["delta"], **TILES["kda"]} if family == "kda" else TILES[family]
    on_checkpoint = const["READ_FMT"] == ReadCode.CHECKPOINT     # no read copy: every pass reads the checkpoint
    vk_tile = vk and on_checkpoint
    fold = tiles["decode_vk" if vk_tile else "decode"]
    if T == 1 and const["COMMITTED"] and on_checkpoint and fold.get("fold", True):
        # a decode on the checkpoint: one launch folds its flush rows too (unless the tile says
        # fold=False: then the decode's flush rows take the flush pass, as behind a read copy)
        tile = dict(fold, CHUNK=min(fold["chunk"], cols), FOLD_CHUNK=min(fold["fold_chunk"], cols), CODES_PER_WORD=1,
                    FOLD=True, FOLD_STAGES=fold.get("fold_stages", fold["stages"]))
        return _blocks([(kernels[0], tile, False)], rows, const)
    ver = tiles["verify" if on_checkpoint else "verify_read"]
    tt = max(ver.get("tokens", 2), triton.next_power_of_2(T)) if T != 1 else 1   # the verify's padded tokens
    replay = "flush_replay" in tiles and not on_checkpoint      # delta behind a read copy: replay
    # a replay on a [S, HV, V, K] checkpoint has its own tiles
    suffix = "_vk" if vk and replay else ""
    flush = tiles[("verify_flush" if T != 1 else "flush_replay" if replay else "flush_vk" if vk_tile else "flush")
                  + suffix]
    flush = dict(flush, ROW_PROGRAMS=flush["row_programs"], SCAN_ROWS=FLUSH_SCAN_ROWS)
    if family == "mamba2":
        flush = dict(flush, CHUNK=min(flush["chunk"], cols), PADDED_T=tt)
    else:
        flush = dict(flush, ROWS_FROM_BLOCKS=flush.get("rows_from_blocks", False),
                     KEY_RUNS=min(flush.get("key_runs", 0), cols))
    if T == 0:                                                        # flush-only: the flush pass alone
        plan = []
    elif T > 1:
        pw = _PER_WORD_VERIFY[const["READ_FMT"]]
        nc = min(cols, max(ver["chunk"], 16 * pw))
        # a verify on the checkpoint is one launch: the verify kernel folds its flush rows' history too
        # (unless the tile says fold=False: then the flush pass folds it)
        vfold = on_checkpoint and ver.get("fold", True)
        plan = [(kernels[1], dict(ver, CHUNK=nc, CODES_PER_WORD=pw, CHUNK_WORDS=max(16, nc // pw), PADDED_T=tt,
                                  FOLD=vfold), False)]
        if vfold:
            return _blocks(plan, rows, const)
    else:
        pw = _PER_WORD[const["READ_FMT"]]
        dec = tiles["read" if pw > 1 else "read_fp8" if not on_checkpoint else "decode_vk" if vk_tile
                    else "decode"]
        unused = dict(FOLD_CHUNK=16, dot="ieee", FOLD_STAGES=1)           # the fold's: unused here
        plan = [(kernels[0], dict(dec, CHUNK=max(pw, min(dec["chunk"], cols)), CODES_PER_WORD=pw, FOLD=False,
                                  **unused), False)]
    plan.append((kernels[2], flush, True))
    return _blocks(plan, rows, const)


# (kernel constexpr, tile key): the planner's own keys are upper case, the tile table's lower case
_CONSTEXPR_KEYS = (("CHUNK", "CHUNK"), ("CODES_PER_WORD", "CODES_PER_WORD"), ("CHUNK_WORDS", "CHUNK_WORDS"),
                   ("PADDED_T", "PADDED_T"), ("STAGES", "stages"), ("FOLD_STAGES", "FOLD_STAGES"), ("DOT", "dot"),
                   ("ACC", "acc"), ("FOLD", "FOLD"), ("FOLD_CHUNK", "FOLD_CHUNK"), ("ROW_PROGRAMS", "ROW_PROGRAMS"),
                   ("SCAN_ROWS", "SCAN_ROWS"), ("ROWS_FROM_BLOCKS", "ROWS_FROM_BLOCKS"),
                   ("KEY_RUNS", "KEY_RUNS"))


def _blocks(plan: list[tuple], rows: int, const: dict) -> list[tuple]:
    """(kernel, rows per program, the grid's last dimension, constexprs, warps, is the flush pass,
    register cap or None) of (kernel, tile, flush pass)."""
    out = []
    for kernel, tile, flush_pass in plan:
        block = min(tile["rows"], max(16, triton.next_power_of_2(rows)))
        extra = {k: tile[t] for k, t in _CONSTEXPR_KEYS if t in tile}
        out.append((kernel, block, tile["ROW_PROGRAMS"] if flush_pass else "n", {**const, **extra}, tile["num_warps"],
                    flush_pass, tile.get("maxnreg")))
    return out


@dataclass
class Launch:
    """One kernel launch: the Triton function, its grid (``"n"`` = rows), arguments in kernel order
    (without constexprs; ``by_name`` orders them from the kernel's parameter names), constexprs,
    warps, whether it is the step's flush pass, and the tile's register cap (``maxnreg``, or None). The torch ops run it, passing the arguments by
    name; the TensorRT AOT path compiles the same function with the same arguments."""

    op: str
    kernel: object
    grid: tuple
    n: int
    args: list
    constexprs: dict
    num_warps: int
    flush_pass: bool
    maxnreg: int | None = None

    @classmethod
    def by_name(cls, op: str, kernel, grid: tuple, n: int, args: dict, constexprs: dict, num_warps: int,
                flush_pass: bool, maxnreg: int | None = None) -> "Launch":
        """The launch of ``args`` named by the kernel's parameters (ValueError unless they are its
        runtime parameters, every one), in kernel order."""
        names = runtime_parameters(kernel, constexprs)
        if set(args) != set(names):
            raise ValueError(f"{kernel.__name__}: arguments {sorted(set(args) - set(names))} are no runtime "
                             f"parameters, {sorted(set(names) - set(args))} are missing")
        return cls(op, kernel, grid, n, [args[a] for a in names], constexprs, num_warps, flush_pass, maxnreg)

    def options(self) -> dict:
        """The launch's compile options: ``num_warps``, and ``maxnreg`` where the tile caps the
        registers per thread."""
        return dict(num_warps=self.num_warps, **({} if self.maxnreg is None else dict(maxnreg=self.maxnreg)))

    def kwargs(self) -> dict:
        """The runtime arguments by parameter name."""
        return dict(zip(runtime_parameters(self.kernel, self.constexprs), self.args))

    def run(self):
        """Launch the kernel on its grid (``"n"``: the step's rows); returns Triton's compiled kernel."""
        grid = tuple(self.n if d == "n" else d for d in self.grid)
        return self.kernel[grid](**self.kwargs(), **self.options(), **self.constexprs)


def runtime_parameters(kernel, constexprs: dict) -> list[str]:
    """A Triton kernel's parameters that are not ``constexprs``, in its order."""
    return [a for a in kernel.arg_names if a not in constexprs]


def launch(plan: list[Launch]) -> None:
    """Run launches in order (first launch of each variant is logged)."""
    for lc in plan:
        _log_first((lc.op, tuple(sorted(lc.constexprs.items())), lc.maxnreg))
        lc.run()


def _log_first(key) -> None:
    if key not in _compiled:
        _compiled.add(key)
        log.info("replayssm: first launch of %s (compiles once)", key)
