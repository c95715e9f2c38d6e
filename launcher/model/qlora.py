"""QLoRA's NF4 base as both the planner and the worker see it: which frozen linear weights are quantized, and
their bytes.

torchao's NF4Tensor (torchao.quantization.quantize_.workflows.nf4.nf4_tensor, ``to_nf4(w, block_size=64,
scaler_block_size=256)``) stores a weight of n elements as
  quantized_data       n/2 bytes    two 4-bit NormalFloat codes per uint8 (convert_to_norm_float_weight)
  quantized_scalers    n/64 bytes   one int8 absmax scaler per 64-element block (double_quantize_scalers)
  quantization_factor  n/16384 x w  one factor per 256 scalers, in the weight's dtype
  scaler_mean, nf4     17 x w       the scalers' mean and the 16-entry code table, per tensor (every shard too)
[Dettmers et al., QLoRA, arXiv:2305.14314 §3: 4-bit NormalFloat, double quantization]. Its LinearNF4 (F.linear
on an NF4 weight) saves the NF4 weight, not a copy, and dequantizes the whole weight in forward and again in
backward (get_original_weight): a transient of one linear at a time.

Only what NF4Tensor and FSDP2's sharding of it take is quantized: a frozen nn.Linear inside the transformer
blocks (embeddings, norms and the head stay in the working dtype, as in torchtune's QLoRA recipes) whose n is a
multiple of 64 x 256 per shard (from_tensor asserts it; nf4_split splits every inner tensor evenly) and whose rows
divide evenly over the shard ranks. Pure: no torch here, the worker's rank side quantizes.
"""

from __future__ import annotations

NF4_BLOCK = 64
"""Elements per absmax block (to_nf4's block_size default, QLoRA's 64)."""
NF4_SCALER_BLOCK = 256
"""Block scalers per second-level quantization factor (to_nf4's scaler_block_size default)."""
NF4_TABLE = 16
"""Entries of the NF4 code table each NF4Tensor keeps in the weight's dtype."""


def nf4_eligible(out_features: int, in_features: int, shard_ranks: int) -> bool:
    """Whether a frozen linear weight of this shape is stored in NF4 when sharded over ``shard_ranks``."""
    n = out_features * in_features
    return n > 0 and n % (NF4_BLOCK * NF4_SCALER_BLOCK * shard_ranks) == 0 and out_features % shard_ranks == 0


def nf4_bytes(numel: int, dtype_bytes: int, shard_ranks: int = 1) -> float:
    """Bytes of one NF4 weight's shard: the codes, the int8 scalers and the factors divided over the shards, the
    scalers' mean and the code table on every shard."""
    split = numel / 2 + numel / NF4_BLOCK + dtype_bytes * numel / (NF4_BLOCK * NF4_SCALER_BLOCK)
    return split / shard_ranks + dtype_bytes * (1 + NF4_TABLE)


def dequant_transient_bytes(numel: int, dtype_bytes: int) -> float:
    """Peak bytes of NF4Tensor.get_original_weight for one weight of ``numel`` elements: both halves' codes as
    int64 indices (8 x n/2 each), their looked-up values and the scaled values (w x n/2 each), and the stacked
    full weight (w x n), all alive at the stack; the local variables die when it returns."""
    return 8 * numel + 3 * dtype_bytes * numel


NF4_CHUNK = 1024**2
"""Elements torchao quantizes at once (nf4_tensor.CHUNK_SIZE): the nearest-code search's temporaries are this big."""


def quantize_transient_bytes(numel: int, dtype_bytes: int) -> float:
    """Peak bytes of to_nf4 on one weight of ``numel`` elements (NF4Tensor.convert_to_norm_float_weight): the
    input and its block-scaled copy (w x n each), the uint8 codes (n), and per chunk of c = min(n, NF4_CHUNK)
    elements the search's (value - nf4) and its abs(), c x 16 codes x w each, alive together."""
    c = min(numel, NF4_CHUNK)
    return 2 * dtype_bytes * numel + numel + 2 * NF4_TABLE * dtype_bytes * c


def block_nf4(shapes: list[list[int]], shard_ranks: int) -> list[int]:
    """Element counts of the block's frozen linear weights that are quantized (``shapes``: (out, in) of each
    frozen nn.Linear weight in the largest block, ModelStats.block_linear_shapes)."""
    return [o * i for o, i in shapes if nf4_eligible(o, i, shard_ranks)]
