"""Packing (``data.packing: true``): several examples per sequence of exactly ``max_seq_len`` tokens.

Examples are taken in order and placed next-fit: one goes into the current sequence while it fits, else the
sequence is closed (its tail padded) and a new one starts. Each example keeps its own labels, and the label of
its first token is -100 so nothing is trained on predicting one example from the one before it. Position ids
restart at 0 for every example (and for the padded tail).

Whether attention crosses examples depends on the kernel: the batch carries ``position_ids`` and the forward
gets no attention mask, which is how transformers' flash_attention_2 finds the example boundaries
(``DataCollatorWithFlattening``'s convention) and attends within each example only. sdpa and eager have no such
path without a 4D block mask: with them a token also attends to the earlier examples of its sequence (causally).
The positions still restart, and the labels never cross.
"""

from __future__ import annotations

import torch

from launcher.worker.chat import IGNORE
from launcher.worker.examples import next_fit


def pack(examples: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask (1 on real tokens, for counting), labels and position_ids of the packed
    sequences (launcher.worker.examples.next_fit's bins), each exactly ``seq_len`` long; none for no examples."""
    seqs = [[examples[i] for i in b] for b in next_fit([len(ids) for ids, _ in examples], seq_len)]
    n = len(seqs)
    out = {
        "input_ids": torch.full((n, seq_len), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((n, seq_len), dtype=torch.long),
        "labels": torch.full((n, seq_len), IGNORE, dtype=torch.long),
        "position_ids": torch.zeros((n, seq_len), dtype=torch.long),
    }
    for i, seq in enumerate(seqs):
        pos = 0
        for ids, labels in seq:
            k = len(ids)
            out["input_ids"][i, pos : pos + k] = torch.tensor(ids, dtype=torch.long)
            out["attention_mask"][i, pos : pos + k] = 1
            out["labels"][i, pos + 1 : pos + k] = torch.tensor(labels[1:], dtype=torch.long)
            out["position_ids"][i, pos : pos + k] = torch.arange(k)
            pos += k
        out["position_ids"][i, pos:] = torch.arange(seq_len - pos)  # the tail is one more (untrained) segment
    return out
