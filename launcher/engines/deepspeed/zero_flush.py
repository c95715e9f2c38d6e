"""ZeRO-2's gradient reduce, hook by hook: what a rank holds beside its states while the bucket is flushed.

DeepSpeed 0.19's stage_1_and_2.py with contiguous_gradients and without overlap_comm (the emitted ds_config):
each trainable tensor's gradient hook (grad_handling_hook -> reduce_independent_p_g_buckets_and_remove_grads) copies
the gradient into the reduce bucket (reduce_bucket_size elements, allocated at the first hook), first flushing the
bucket when the gradient would overflow it (reduce_ipg_grads), and independent_gradient_partition_epilogue flushes
what is left after backward. A flush (average_tensor -> allreduce_and_scatter -> allreduce_bucket) flattens the
bucket's slices, one per rank's partition they fall in, with self.flatten, in chunks that close once they pass the
bucket size: a copy of a chunk of two slices or more, none of a lone slice (torch's flatten_dense_tensors returns it
as a view). Then copy_grads_in_partition copies each gradient of a tensor in the rank's partition into
grads_in_partition, allocated at the rank's first such copy and freed at the epilogue's end (_release_ipg_buffers)
unless accumulation keeps it: all_grad_tensors holds its views and later micro-steps add into them until the
boundary.

grads_in_partition is sized by get_partition_info's params_in_partition, every tensor that overlaps the rank's
partition, whole: Σ numel over them, not the partition. A rank whose partition starts or ends inside a large tensor
(MiniLM's word table, first in the flat order, half the model) holds all of it. The same on CUDA and CPU ranks: none
of this depends on the device or the backend. A tensor larger than the bucket bypasses it (extra_large_param_to_reduce)
and is flattened on its own at the next flush.

The hooks fire in the reverse of the flat order (the gradients of the last layers first), which is what this assumes;
a tied embedding's hook fires last, after its three tables meet (terms.tied_embedding_grad_bytes).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from launcher.model.introspect import ModelStats
from launcher.planner.terms import tied_embedding_grad_bytes

During = Literal["blocks", "embeddings", "after"]
"""Where backward is at an instant: in the blocks or the head (their backward's temporaries held), in the input
embeddings' (the gradient reaching them held), or done."""
Instant = tuple[float, During, int]
"""(share of the blocks whose saved activations are still held, where backward is, working-dtype elements beside the
states)."""


def partition_elems(trainable: int, ranks: int) -> int:
    """Elements of one rank's partition of the flat buffer: DeepSpeed pads it to a multiple of
    nccl_start_alignment_factor (2) x ranks (launcher.engines.deepspeed.flat_partition_elems)."""
    return 2 * -(-trainable // (2 * ranks))


def pieces(layout: tuple[tuple[int, int], ...], ranks: int) -> list[list[tuple[int, int]]]:
    """Each tensor's (rank, elements) slices of the flat buffer, by rank, as average_tensor cuts them."""
    size = partition_elems(sum(n for n, _ in layout), ranks)
    out, start = [], 0
    for n, _ in layout:
        first, last = min(start // size, ranks - 1), min(max(start, start + n - 1) // size, ranks - 1)
        out.append([(r, min(start + n, (r + 1) * size) - max(start, r * size)) for r in range(first, last + 1)])
        start += n
    return out


def grads_in_partition(layout: tuple[tuple[int, int], ...], ranks: int) -> list[int]:
    """Elements of each rank's grads_in_partition: every tensor overlapping its partition, whole."""
    out = [0] * ranks
    for (n, _), cut in zip(layout, pieces(layout, ranks), strict=True):
        for r, _ in cut:
            out[r] += n
    return out


@lru_cache(maxsize=64)
def most_in_partition(layout: tuple[tuple[int, int], ...], ranks: int) -> int:
    """The largest rank's grads_in_partition, elements: asked once per candidate, computed once per layout."""
    return max(grads_in_partition(layout, ranks))


def flatten_copy(slices: list[tuple[int, int]], bucket: int) -> int:
    """The largest tensor allreduce_and_scatter's flatten makes of a flush's (rank, elements) slices, elements: it
    all-reduces them in chunks, closing one once its elements pass the bucket size, and flattens a chunk of two
    slices or more into a new tensor (one slice is a view)."""
    largest, chunk, count = 0, 0, 0
    for _, n in slices:
        chunk, count = chunk + n, count + 1
        if chunk > bucket:
            largest, chunk, count = max(largest, chunk if count > 1 else 0), 0, 0
    return max(largest, chunk if count > 1 else 0)


@lru_cache(maxsize=256)
def zero2_instants(layout: tuple[tuple[int, int], ...], ranks: int, bucket: int, num_blocks: int,
                   accumulating: bool, held: int = 0, tied: int = -1, tied_elems: int = 0) -> tuple[Instant, ...]:
    """Every instant of one backward's reduce, each as the worst rank holds it: the bucket, the gradient whose hook
    runs, a tensor that bypassed the bucket, a flush's flattened copy and grads_in_partition, in elements beyond
    the states; while accumulating, a rank's earlier grads_in_partition less the largest one (which the states
    count: grads_in_partition(...)'s max).

    ``held``: elements held until the hook of tensor ``tied`` (a tied head's gradient, buffered by autograd until
    the input embedding's backward), just before which ``tied_elems`` meet (the three tables of the sum)."""
    gip = grads_in_partition(layout, ranks)
    most = max(gip)
    cuts = pieces(layout, ranks)
    first_block = next((i for i, (_, b) in enumerate(layout) if b >= 0), len(layout))

    def alive(i: int) -> tuple[float, During]:
        """Share of the blocks whose activations are held while tensor i's gradient is made, and where backward is."""
        block = layout[i][1]
        if block >= 0:
            return (block + 1) / num_blocks, "blocks"
        return (0.0, "embeddings") if i < first_block else (1.0, "blocks")

    # The largest per-rank part, kept as ranks allocate: an allocated rank's grads_in_partition (twice while
    # accumulating, less the states' share), else its accumulated one only (at most 0).
    allocated = [False] * ranks
    waiting = sorted(range(ranks), key=lambda r: -gip[r])  # the unallocated, largest first (skipped once allocated)
    first = 0
    done = -most if accumulating else 0

    def worst() -> int:
        nonlocal first
        while first < ranks and allocated[waiting[first]]:
            first += 1
        idle = (gip[waiting[first]] - most if accumulating else 0) if first < ranks else done
        return max(done, idle)

    def allocate(r: int) -> None:
        nonlocal done
        if not allocated[r]:
            allocated[r] = True
            done = max(done, gip[r] + (gip[r] - most if accumulating else 0))

    part = worst()
    out: list[Instant] = []
    content: list[int] = []  # tensors in the bucket (or the one that bypassed it)
    filled = 0
    large = False  # content is one tensor larger than the bucket, reduced alone (extra_large_param_to_reduce)

    def flush(f: float, running: During, beside: int) -> None:
        nonlocal content, filled, large, part
        if content:
            slices: list[tuple[int, int]] = []
            for i in content:  # average_tensor merges a tensor's slice with the one before it in the same partition
                for r, n in cuts[i]:
                    if slices and slices[-1][0] == r:
                        slices[-1] = (r, slices[-1][1] + n)
                    else:
                        slices.append((r, n))
            own = layout[content[0]][0] if large else 0  # the bypassing gradient is its own tensor, beside the bucket
            out.append((f, running, bucket + beside + own + flatten_copy(slices, bucket) + part))
            for i in content:
                for r, _ in cuts[i]:
                    allocate(r)
            part = worst()
        out.append((f, running, bucket + beside + part))
        content, filled, large = [], 0, False

    for i in reversed(range(len(layout))):
        n = layout[i][0]
        if not n:  # reduce_independent_p_g_buckets_and_remove_grads returns at once
            continue
        f, at = alive(i)
        if i == tied:  # the three tables meet in AccumulateGrad's sum, before the hook sees the one it made
            out.append((f, at, bucket + tied_elems + part))
        still = held if 0 <= tied < i else 0
        if filled + n > bucket:
            flush(f, at, n + still)
        out.append((f, at, bucket + n + still + part))
        content.append(i)
        filled += n
        large = n > bucket
    flush(0.0, "after", 0)
    return pareto(out)


def pareto(instants: list[Instant]) -> tuple[Instant, ...]:
    """The instants no other outweighs: for each place backward is at, those holding more than every instant with
    as many or more blocks' activations (an instant's total grows with both)."""
    best: dict[tuple[float, During], int] = {}
    for share, at, elems in instants:
        best[share, at] = max(best.get((share, at), elems), elems)
    front: list[Instant] = []
    for at in ("blocks", "embeddings", "after"):
        top = None
        for share in sorted((f for f, a in best if a == at), reverse=True):
            if top is None or best[share, at] > top:
                top = best[share, at]
                front.append((share, at, top))
    return tuple(front)


_PAIRS: dict[int, tuple[list, tuple[tuple[int, int], ...]]] = {}
"""id(a grad_layout) -> (that list, kept so the id stays its own; its pairs)."""


def layout_pairs(grad_layout: list[list[int]]) -> tuple[tuple[int, int], ...]:
    """ModelStats.grad_layout as (elements, block) pairs, made once per list (a 70B model's has ~700; stats are not
    changed once made): every ZeRO-2 candidate's states read it, and the caches above key on the pairs."""
    hit = _PAIRS.get(id(grad_layout))
    if hit is not None and hit[0] is grad_layout:
        return hit[1]
    if len(_PAIRS) >= 8:  # one request plans one model (the advice's LoRA suggestion another)
        _PAIRS.clear()
    pairs = tuple((int(n), int(b)) for n, b in grad_layout)
    _PAIRS[id(grad_layout)] = (grad_layout, pairs)
    return pairs


def zero2_reduce(m: ModelStats, w: int, ranks: int, bucket: int, accumulating: bool,
                 bucket_bytes: float) -> tuple[float, tuple[tuple[float, During, float], ...]]:
    """ZeRO-2's reduce for a model with a known grad_layout, in bytes of the working dtype ``w``: (the gradients
    a micro-step leaves while accumulating, the largest grads_in_partition; its reduce instants for
    States.reduce_instants). ``bucket``: reduce_bucket_size, elements; ``bucket_bytes``: what the bucket
    allocates (twice the elements with overlap_comm)."""
    layout = layout_pairs(m.grad_layout)
    table = m.vocab_size * m.hidden_size
    tied = -1
    if tied_embedding_grad_bytes(m, w):  # a causal LM's trainable head tied to its input embedding (GPT-2)
        tied = next((i for i, (n, b) in enumerate(layout) if b < 0 and n == table), -1)
    instants = zero2_instants(layout, ranks, bucket, m.num_blocks, accumulating, held=table if tied >= 0 else 0,
                              tied=tied, tied_elems=3 * table if tied >= 0 else 0)
    kept = w * most_in_partition(layout, ranks) if accumulating else 0.0
    return kept, tuple((share, at, w * elems + bucket_bytes - w * bucket) for share, at, elems in instants)
