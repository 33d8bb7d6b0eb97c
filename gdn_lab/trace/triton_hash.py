"""The row stage of `gdn_lab.trace.hashing` as one fused Triton kernel per tensor (CUDA/ROCm), or
one per batch of tensors.

Same bits as the torch ops (tests compare them under TRITON_INTERPRET=1). The torch ops take about
15 launches per tensor; a launch-bound forward with hundreds of hashed tensors pays for each, so on
the GPU one launch hashes a tensor, through the compiled kernel's own launcher (`launch_cached`).
A recorder that queues its reads (`record` at level="ops") runs them in batches, `row_values_many`:
one launch per tile shape for all of them, their addresses in a table.

A program sums at most COLS_PER_PROGRAM columns of its block of rows, and a wide row's column
blocks add into it atomically: a request's row in a per-request layout ([B, T * H], millions of
words) is spread over a thousand programs instead of one. The sums are int64 sums mod 2^64,
exact in any order, so the atomics cannot change the bits.

How finely (measured on the H200, GPU time per tensor): few row blocks are split until about
MIN_PROGRAMS programs run ([1, 2^20] bf16: 27 us in 64 programs of 16 column blocks, 8 us in
1024 of one; [64, 32768]: 34 us, 9 us), while many row blocks are left whole ([1024, 2048]:
7.7 us whole, 10.6 us with its two column blocks split).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from gdn_lab.ops.triton_common import launch_cached, pow2_at_least
from gdn_lab.ops.triton_support import interpreting
from gdn_lab.trace.mixing import M1, M2, G

_G = tl.constexpr(G)
_M1 = tl.constexpr(M1)
_M2 = tl.constexpr(M2)
_MASK30 = tl.constexpr((1 << 34) - 1)
_MASK27 = tl.constexpr((1 << 37) - 1)
_MASK31 = tl.constexpr((1 << 33) - 1)
MAX_TILE = 2048  # BLOCK_R * BLOCK_F: int64 accumulators held per program
MAX_BLOCK_F = 1024
COLS_PER_PROGRAM = 16 * MAX_BLOCK_F
MIN_PROGRAMS = 1024  # split rows into column blocks until about this many programs run
SPLIT_BELOW = 256  # ... when fewer row blocks than this: more of them keep the GPU busy without atomics
_INT32_MAX = 2**31 - 1
# The many-tensor launch's table: one int64 row per tensor, these columns (END and START bound the
# tensor's programs; ADDR and OUT are its words' and its first row value's addresses; S0 the row
# stride and D2, D3, S1, S2, S3 the trailing dims' as `_strides` gives them, contiguous rows as one
# dim of stride 1).
_TABLE = ("END", "START", "ADDR", "OUT", "R", "F", "N_ITER", "N_COL", "WORD_SIZE", "S0", "D2", "D3", "S1", "S2", "S3")
_N_COLUMNS = len(_TABLE)
_COLUMNS = tl.constexpr(_N_COLUMNS)
(_END, _START, _ADDR, _OUT, _R, _F, _N_ITER, _N_COL, _WORD_SIZE,
 _S0, _D2, _D3, _S1, _S2, _S3) = (tl.constexpr(i) for i in range(len(_TABLE)))  # fmt: skip
# The word of an element by its size: 1-byte types zero-extended, wider ones sign-extended.
_WORD = {1: tl.uint8, 2: tl.int16, 4: tl.int32, 8: tl.int64}


@triton.jit
def _mix(z):
    # splitmix64's finalizer; `>>` on int64 is arithmetic, the masks make it logical.
    z = z ^ ((z >> 30) & _MASK30)
    z = z * _M1
    z = z ^ ((z >> 27) & _MASK27)
    z = z * _M2
    return z ^ ((z >> 31) & _MASK31)


@triton.jit
def _block_sums(p_base, o_r64, m_r, col0, n_iter, F, s0, d2, d3, s1, s2, s3, WORD: tl.constexpr,
                TRAILING: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):  # fmt: skip
    """The row values of one block of rows (o_r64, valid where m_r) over its n_iter column tiles from
    col0, its words read from p_base at `_strides`' layout TRAILING: int64 [BLOCK_R]."""
    b_acc = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.int64)
    o_c = tl.arange(0, BLOCK_F).to(tl.int64)
    # each column's step (j + 1) * G, carried from tile to tile by an add of BLOCK_F * G (exact mod
    # 2^64, as the products are): a 64-bit multiply per column costs 3 integer multiplies a word
    b_step = (col0 + o_c + 1) * _G
    b_inc = (tl.zeros([], tl.int64) + BLOCK_F) * _G
    for it in range(0, n_iter):
        o_f = col0 + it * BLOCK_F + o_c
        m_x = m_r[:, None] & (o_f < F)[None, :]
        if TRAILING == 0:  # contiguous rows of F words
            p_x = p_base + o_r64[:, None] * F + o_f[None, :]
        else:  # row stride s0; word j of a row at the strides of its 1-3 trailing dims (d1, d2, d3)
            if TRAILING == 1:
                o_e = o_f * s3
            elif TRAILING == 2:
                o_e = (o_f // d3) * s2 + (o_f % d3) * s3
            else:
                o_e = (o_f // (d2 * d3)) * s1 + ((o_f // d3) % d2) * s2 + (o_f % d3) * s3
            p_x = p_base + o_r64[:, None] * s0 + o_e[None, :]
        # each element's bits as its word (a no-op for integer words), then zero- or sign-extended;
        # masked elements are left undefined (no `other`: 0 does not cast to every float type) and
        # dropped below
        b_w = tl.load(p_x, mask=m_x).to(WORD, bitcast=True).to(tl.int64)
        b_z = _mix(b_w + b_step[None, :])
        b_acc += tl.where(m_x, b_z, 0)
        b_step += b_inc
    return tl.sum(b_acc, axis=1)


# s0 and s3 stay specialised (a stride of 1 tells the compiler which axis is contiguous: a
# transposed weight's rows are), and F (a multiple of 16 lets contiguous rows load 16 bytes at once)
@triton.jit(do_not_specialize=["offset", "R", "n_iter", "d2", "d3", "s1", "s2"])
def _row_values_kernel(
    x_ptr,
    out_ptr,
    offset,
    R,
    F,
    n_iter,
    s0,
    d2,
    d3,
    s1,
    s2,
    s3,
    WORD: tl.constexpr,
    TRAILING: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_F: tl.constexpr,
    SPLIT: tl.constexpr,
):
    i_r = tl.program_id(0)
    i_c = tl.program_id(1)
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = o_r < R
    o_r64 = o_r.to(tl.int64)
    col0 = i_c.to(tl.int64) * n_iter * BLOCK_F
    b_sum = _block_sums(x_ptr, o_r64, m_r, col0, n_iter, F, s0, d2, d3, s1, s2, s3, WORD, TRAILING, BLOCK_R, BLOCK_F)
    if SPLIT:  # several programs share these rows: add (out holds zeros)
        tl.atomic_add(out_ptr + offset + o_r64, b_sum, mask=m_r)
    else:
        tl.store(out_ptr + offset + o_r64, b_sum, mask=m_r)


@triton.jit
def _words_at(addr, WORD: tl.constexpr, ALIGNED: tl.constexpr):
    """The words at address addr, as a pointer the compiler knows 16-byte aligned when ALIGNED."""
    p = addr.to(tl.pointer_type(WORD))
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit(do_not_specialize=["first", "n_tensors"])
def _row_values_many_kernel(
    table_ptr, first, n_tensors, TRAILING: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr
):
    """The row stage of n_tensors tensors in one launch, one table row each from row `first` (`_TABLE`):
    program p works for the tensor whose range of programs holds p, at its place in that tensor's
    (row block, column block) grid, reading words of the size its row names. TRAILING 0 reads
    contiguous rows of F words, F a multiple of 16 and the first word 16-byte aligned (the compiler
    told so: 16-byte vector loads); TRAILING 1 addresses word j of a row at j * S3; TRAILING 3
    through its 1-3 trailing dims (any `_strides` layout: with the left padding, fewer dims reduce
    to the same sum), at the registers of a division and a modulo per word."""
    pid = tl.program_id(0).to(tl.int64)
    i = first.to(tl.int64)
    for j in range(first, first + n_tensors):  # the tensors before p's: their ranges end at or before p
        i += (tl.load(table_ptr + j * _COLUMNS + _END) <= pid).to(tl.int64)
    row = table_ptr + i * _COLUMNS
    n_col = tl.load(row + _N_COL)
    n_iter = tl.load(row + _N_ITER)
    local = pid - tl.load(row + _START)
    o_r64 = (local // n_col) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    m_r = o_r64 < tl.load(row + _R)
    col0 = (local % n_col) * n_iter * BLOCK_F
    F, s0, s3 = tl.load(row + _F), tl.load(row + _S0), tl.load(row + _S3)
    d2, d3, s1, s2 = 1, 1, 1, 1
    if TRAILING == 3:
        d2, d3, s1, s2 = tl.load(row + _D2), tl.load(row + _D3), tl.load(row + _S1), tl.load(row + _S2)
    word = tl.load(row + _WORD_SIZE)
    addr = tl.load(row + _ADDR)
    if TRAILING == 0:
        F = tl.multiple_of(F, 16)
    b_sum = tl.zeros([BLOCK_R], dtype=tl.int64)
    # the word size is data here: a branch per size, each reading the words at their own type
    if word == 2:
        b_sum = _block_sums(_words_at(addr, tl.int16, TRAILING == 0), o_r64, m_r, col0, n_iter, F, s0, d2, d3, s1, s2, s3,
                            tl.int16, TRAILING, BLOCK_R, BLOCK_F)  # fmt: skip
    elif word == 4:
        b_sum = _block_sums(_words_at(addr, tl.int32, TRAILING == 0), o_r64, m_r, col0, n_iter, F, s0, d2, d3, s1, s2, s3,
                            tl.int32, TRAILING, BLOCK_R, BLOCK_F)  # fmt: skip
    elif word == 1:
        b_sum = _block_sums(_words_at(addr, tl.uint8, TRAILING == 0), o_r64, m_r, col0, n_iter, F, s0, d2, d3, s1, s2, s3,
                            tl.uint8, TRAILING, BLOCK_R, BLOCK_F)  # fmt: skip
    else:
        b_sum = _block_sums(_words_at(addr, tl.int64, TRAILING == 0), o_r64, m_r, col0, n_iter, F, s0, d2, d3, s1, s2, s3,
                            tl.int64, TRAILING, BLOCK_R, BLOCK_F)  # fmt: skip
    p_out = tl.load(row + _OUT).to(tl.pointer_type(tl.int64)) + o_r64
    if n_col > 1:  # several programs share these rows: add (out holds zeros)
        tl.atomic_add(p_out, b_sum, mask=m_r)
    else:
        tl.store(p_out, b_sum, mask=m_r)


@functools.lru_cache(maxsize=1024)
def _launch_config(r: int, f: int) -> tuple[tuple[int, int, int], int, int, int, bool]:
    """(grid, n_iter, BLOCK_R, BLOCK_F, SPLIT) for r rows of f words: a recorder hashes the same
    few shapes hundreds of times per forward."""
    block_f = pow2_at_least(max(f, 1), floor=1) if f < MAX_BLOCK_F else MAX_BLOCK_F
    # no more tile rows than rows: a [B, ...] tensor at batch 1 is one row, and a second tile row
    # would mask half the lanes of a kernel bound by its integer math
    block_r = max(1, min(64, MAX_TILE // block_f, pow2_at_least(max(r, 1), floor=1)))
    row_blocks = -(-r // block_r)
    tiles = -(-f // block_f)
    wanted = -(-MIN_PROGRAMS // row_blocks) if 0 < row_blocks < SPLIT_BELOW else 1
    n_col = max(1, min(tiles, max(wanted, -(-tiles // (COLS_PER_PROGRAM // block_f)))))
    n_iter = -(-tiles // n_col) if tiles else 0
    n_col = -(-tiles // n_iter) if n_iter else 1  # no program left without columns
    return (row_blocks, n_col, 1), n_iter, block_r, block_f, n_col > 1


def _strides(t: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    """(TRAILING, (s0, d2, d3, s1, s2, s3)) that address a non-contiguous tensor's words in place:
    its row stride, and its trailing dims with size-1 dims dropped and dims that continue each
    other merged (at most 3, left-padded: d1 is implied by F), or None past 3 such dims."""
    dims: list[tuple[int, int]] = []  # (size, stride), outer to inner
    for size, stride in zip(t.shape[1:], t.stride()[1:]):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:  # the outer dim steps over this one exactly
            dims[-1] = (dims[-1][0] * size, stride)
        else:
            dims.append((size, stride))
    if len(dims) > 3:
        return None
    (_, s1), (d2, s2), (d3, s3) = [(1, 0)] * (3 - len(dims)) + dims
    return max(len(dims), 1), (t.stride(0), d2, d3, s1, s2, s3)


_CONTIGUOUS = (0, (1, 1, 1, 1, 1, 1))  # TRAILING 0: the strides are not read


def _addressed(words: torch.Tensor) -> tuple[torch.Tensor, tuple[int, tuple[int, ...]]]:
    """(the words a kernel reads, their (TRAILING, strides)): the tensor in place where `_strides`
    addresses it, else a contiguous copy."""
    layout = _CONTIGUOUS if words.is_contiguous() else _strides(words)
    if layout is None:
        return words.contiguous(), _CONTIGUOUS
    return words, layout


def row_values_triton(words: torch.Tensor, r: int, f: int, out: torch.Tensor, offset: int = 0) -> None:
    """out[offset + i] = sum_j mix(words[i][j] + (j + 1) * G) for rows i < r, as `hashing.row_values`.

    Args:
        words: a tensor of r rows of f words (its leading dim the rows, the rest row-major): integer
            or a dtype the kernel bitcasts (`hashing._TRITON_AS_IS`). Any strides: a tensor whose
            rows are not contiguous is read in place when its trailing dims merge into at most
            three (transposes, slices, broadcasts), else through a contiguous copy.
        r, f: rows and words per row.
        out: int64, contiguous, zero-filled at [offset, offset + r) (rows wider than
            COLS_PER_PROGRAM add into it).
        offset: the first row's element of out.
    """
    words, (trailing, strides) = _addressed(words)
    grid, n_iter, block_r, block_f, split = _launch_config(r, f)
    word = _WORD[words.element_size()]
    args = (words, out, offset, r, f, n_iter, *strides, word, trailing, block_r, block_f, split)
    if interpreting():
        _row_values_kernel[grid](*args)
        return
    # What the compilation depends on: the constexprs, the words' dtype (and so WORD), the pointers'
    # 16-byte alignment, the specialised ints' (s0, s3, F) ==1 and divisibility by 16, and whether
    # the ints need 64 bits (unspecialised ints still type by range).
    wide = max(r, f, offset, *strides) > _INT32_MAX
    s0, s3 = strides[0], strides[-1]
    p_words, p_out = words.data_ptr(), out.data_ptr()  # the launcher takes them as ints
    key = (block_r, block_f, split, trailing, s0 == 1, s0 % 16 == 0, s3 == 1, s3 % 16 == 0, f == 1, f % 16 == 0,
           words.dtype, p_words & 15 == 0, p_out & 15 == 0, wide)  # fmt: skip
    launch_cached(_row_values_kernel, grid, args, key, (p_words, p_out, *args[2:]))


def row_values_many(items: Sequence[tuple[torch.Tensor, int, int, torch.Tensor, int]]) -> None:
    """`row_values_triton(words, r, f, out, offset)` for each item, on one device, with one launch
    per tile shape (`_launch_config`'s BLOCK_R x BLOCK_F) and addressing instead of one per tensor:
    contiguous rows of a multiple of 16 words from a 16-byte aligned address (read 16 bytes at a
    time), rows whose words lie at one stride (other contiguous ones, transposes, strided slices),
    and those with 2-3 strides, whose address arithmetic would cost the others registers. The tensors'
    addresses, sizes and strides reach the kernel as a table: on a GPU one host-to-device copy from
    pinned memory. Same bits, same tiles; a lone tensor launches as it is.
    """
    classes: dict[tuple[int, int, int], list[int]] = {}  # launch class -> its tensors' table rows, flat
    shared = []  # the items the table takes
    for item in items:
        words, r, f, out, offset = item
        if not r or not f:  # no words: the rows' values are the zeros out holds
            continue
        # in place, or (more than 3 trailing strides) a contiguous copy read in this launch
        words, (trailing, (s0, d2, d3, s1, s2, s3)) = _addressed(words)
        ptr = words.data_ptr()
        if trailing == 0:  # contiguous: one dim of f words at stride 1
            s0, d3, s3 = f, f, 1
            if f % 16 or ptr % 16:  # not the aligned class (vector loads): addressed at stride 1
                trailing = 1
        grid, n_iter, block_r, block_f, _ = _launch_config(r, f)
        key = (trailing if trailing < 2 else 3, block_r, block_f)
        flat = classes.get(key)
        if flat is None:
            flat = classes[key] = []
        flat += (grid[0] * grid[1], 0, ptr, out.data_ptr() + 8 * offset, r, f, n_iter, grid[1],
                 words.element_size(), s0, d2, d3, s1, s2, s3)  # fmt: skip
        shared.append((words, r, f, out, offset))
    if len(shared) <= 1:  # none, or one tensor: its own launch, no table
        for item in shared:
            row_values_triton(*item)
        return
    table = np.fromiter(itertools.chain.from_iterable(classes.values()), np.int64, len(shared) * _N_COLUMNS)
    table = table.reshape(len(shared), _N_COLUMNS)
    launches, first = [], 0
    for shape, flat in classes.items():
        n = len(flat) // _N_COLUMNS
        part = table[first : first + n]
        ends = np.cumsum(part[:, 0])
        part[:, 1] = ends - part[:, 0]
        part[:, 0] = ends
        launches.append(((int(ends[-1]), 1, 1), (first, n, *shape)))
        first += n
    if interpreting():
        table_t = torch.from_numpy(table)
        for grid, args in launches:
            _row_values_many_kernel[grid](table_t, *args)
        return
    # pinned, so the copy is asynchronous (the host allocator keeps the block until it is done)
    table_t = torch.from_numpy(table).pin_memory().to(shared[0][3].device, non_blocking=True)
    p_table = table_t.data_ptr()
    for grid, args in launches:
        launch_cached(_row_values_many_kernel, grid, (table_t, *args), args[2:], (p_table, *args))
