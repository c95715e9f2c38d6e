"""QLoRA's NF4 base on FSDP2's ranks: the frozen block linears' weights become torchao NF4Tensor parameters.

Each block's weights are quantized just before that block is sharded (so a rank holds one block's full NF4 at a
time): the full weight goes over the process group once (rank 0's checkpoint copy; on a run where every rank
built the model, its own), every rank quantizes the same bytes (to_nf4 is deterministic, so the shards agree on
scaler_mean and the code table) and fully_shard then keeps its row chunk (NF4Tensor's aten.split), all-gathering
it through NF4Tensor's fsdp_pre_all_gather / fsdp_post_all_gather. F.linear on an NF4 weight is torchao's
LinearNF4, so peft's LoRA layers, which call their base_layer, run on the NF4 base unchanged.
torchtune's FrozenNF4Linear and load_from_full_model_state_dict follow the same pattern.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from launcher.model.qlora import NF4_BLOCK, NF4_SCALER_BLOCK, nf4_eligible


def nf4_targets(model: nn.Module, blocks, shard_ranks: int) -> list[dict[str, nn.Linear]]:
    """Per block: state-dict key -> module of each weight to quantize, the frozen nn.Linear that NF4 and FSDP2's
    row sharding take (launcher.model.qlora.nf4_eligible). Called before checkpoint_wrapper renames modules."""
    where = {id(m): i for i, b in enumerate(blocks) for m in b.modules()}
    out: list[dict[str, nn.Linear]] = [{} for _ in blocks]
    for name, mod in model.named_modules():
        if (id(mod) in where and isinstance(mod, nn.Linear) and not mod.weight.requires_grad
                and nf4_eligible(mod.out_features, mod.in_features, shard_ranks)):
            out[where[id(mod)]][f"{name}.weight"] = mod
    return out


def quantize(targets: dict[str, nn.Linear], full: dict[str, torch.Tensor], *, from_rank0: bool,
             dtype: torch.dtype, comm_device: torch.device, device: torch.device) -> None:
    """Replace each target's weight with an NF4Tensor parameter of its full weight on ``device`` (collective when
    ``from_rank0``: every rank, the same order; ``full`` holds rank 0's checkpoint tensors, empty elsewhere)."""
    from torchao.quantization import to_nf4

    for key, mod in targets.items():
        if from_rank0:
            # Sent in the NF4 dtype (rank 0's build may hold another): every rank quantizes the same bytes.
            t = full.pop(key).to(comm_device, dtype) if dist.get_rank() == 0 else torch.empty(
                mod.weight.shape, dtype=dtype, device=comm_device)
            dist.broadcast(t, src=0)
        else:
            t = mod.weight.detach().to(comm_device, dtype)
        nf4 = to_nf4(t.contiguous(), NF4_BLOCK, NF4_SCALER_BLOCK)
        del t
        mod.weight = nn.Parameter(nf4.to(device), requires_grad=False)
