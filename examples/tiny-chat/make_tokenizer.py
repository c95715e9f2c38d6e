"""Regenerate this directory: a 1024-token byte-level BPE trained on the example data, with a ChatML chat template,
beside a tiny random-weight Llama config (no weights: the launcher initializes them).

Run: python examples/tiny-chat/make_tokenizer.py   (after examples/data/make_data.py; downloads nothing)

The result loads offline with AutoTokenizer.from_pretrained("examples/tiny-chat") and is what the chat
fine-tune example (examples/chat-sft.yaml) and the data tests use: a real Hugging Face tokenizer with a chat
template, small enough to train in a second.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, PreTrainedTokenizerFast

HERE = Path(__file__).parent
DATA = HERE.parent / "data"
VOCAB_SIZE = 1024
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, the same text as launcher.worker.formats.CHATML_TEMPLATE (the launcher's default for tokenizers without one).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def texts() -> list[str]:
    out = []
    for name in ("causal.jsonl", "sentiment.jsonl", "pairs.jsonl", "chat.jsonl", "prompt_completion.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            row = json.loads(line)
            out += [m["role"] + "\n" + m["content"] for m in row.get("messages", [])]  # role names as in ChatML
            out += [str(row[k]) for k in ("text", "positive", "prompt", "completion") if k in row]
    return out


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=256)
    fast.save_pretrained(HERE)
    # The template goes into tokenizer_config.json, where every transformers 4.x and 5.x reads it (5.x would
    # otherwise write a chat_template.jinja that older releases ignore).
    cfg_path = HERE / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHATML_TEMPLATE
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # the name transformers 4.x knows too
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (HERE / "chat_template.jinja").unlink(missing_ok=True)
    LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
                bos_token_id=None, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                ).save_pretrained(HERE)


if __name__ == "__main__":
    main()
