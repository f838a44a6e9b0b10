"""The character-level tokenizer: ids, exact round trips on every eval item, and an
offline save_pretrained / AutoTokenizer round trip in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8rl.world.tokenizer import (
    BOS_ID,
    CHARSET,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    VOCAB_SIZE,
    VOCAB_SIZE_PADDED,
    build_tokenizer,
    vocabulary,
)

REPO = Path(__file__).resolve().parents[2]
EVAL_DIR = REPO / "data" / "tiny_eval"
RECORDS = [json.loads(line) for path in sorted(EVAL_DIR.glob("*.jsonl")) for line in path.open()]
TEXTS = [record["prompt"] + record["solution"] for record in RECORDS]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _spec_ids(text: str) -> list[int]:
    """One id per character: its place in CHARSET after the four special tokens."""
    return [len(SPECIAL_TOKENS) + CHARSET.index(char) for char in text]


def test_ids_and_sizes(tokenizer) -> None:
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert (tokenizer.pad_token, tokenizer.bos_token) == ("<pad>", "<bos>")
    assert (tokenizer.eos_token, tokenizer.unk_token) == ("<eos>", "<unk>")
    ids = (tokenizer.pad_token_id, tokenizer.bos_token_id)
    ids += (tokenizer.eos_token_id, tokenizer.unk_token_id)
    assert ids == (0, 1, 2, 3)
    assert len(CHARSET) == len(set(CHARSET)) == 96
    assert len(tokenizer) == VOCAB_SIZE == 100
    assert VOCAB_SIZE_PADDED == 128
    assert VOCAB_SIZE_PADDED % 128 == 0 and VOCAB_SIZE_PADDED >= len(tokenizer)
    assert tokenizer.get_vocab() == vocabulary()


def test_every_eval_item_encodes_one_token_per_character_and_decodes_exactly(tokenizer) -> None:
    assert len(TEXTS) >= 800
    encoded = tokenizer(TEXTS)["input_ids"]
    for text, ids in zip(TEXTS, encoded, strict=True):
        assert ids == _spec_ids(text)
        assert tokenizer.decode(ids) == text
        assert tokenizer.decode([*ids, EOS_ID], skip_special_tokens=True) == text


def test_prompt_and_solution_tokenize_independently(tokenizer) -> None:
    for record in RECORDS[::25]:
        prompt, solution = record["prompt"], record["solution"]
        joined = tokenizer.encode(prompt + solution)
        assert joined == tokenizer.encode(prompt) + tokenizer.encode(solution)


def test_no_special_tokens_are_added_and_unknown_characters_map_to_unk(tokenizer) -> None:
    assert tokenizer("12")["input_ids"] == _spec_ids("12")
    assert tokenizer.encode("a\u00e9b") == [*_spec_ids("a"), UNK_ID, *_spec_ids("b")]
    assert tokenizer.encode("  \n\t") == [*_spec_ids("  \n"), UNK_ID]  # tab is not in CHARSET


def test_batches_pad_with_pad_id_and_carry_no_token_type_ids(tokenizer) -> None:
    batch = tokenizer(["1+1", "12+34"], padding=True)
    assert set(batch) == {"input_ids", "attention_mask"}
    assert batch["input_ids"][0][3:] == [PAD_ID, PAD_ID]
    assert batch["attention_mask"][0] == [1, 1, 1, 0, 0]


_ROUND_TRIP = """
import json, sys
from transformers import AutoTokenizer
directory, texts_file = sys.argv[1], sys.argv[2]
texts = json.load(open(texts_file))
tokenizer = AutoTokenizer.from_pretrained(directory)
ids = tokenizer(texts)["input_ids"]
print(json.dumps({
    "ids": ids,
    "decoded": [tokenizer.decode(i) for i in ids],
    "special": [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
                tokenizer.unk_token_id],
    "size": len(tokenizer),
}))
"""


def test_save_pretrained_round_trips_through_auto_tokenizer_offline(tokenizer, tmp_path) -> None:
    tokenizer.save_pretrained(tmp_path / "tok")
    assert {"tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (tmp_path / "tok").iterdir()
    }
    (tmp_path / "texts.json").write_text(json.dumps(TEXTS))
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",  # any attempt to reach a hub fails
        HF_HOME=str(tmp_path / "hf_home"),  # an empty cache
    )
    out = subprocess.run(
        [sys.executable, "-c", _ROUND_TRIP, str(tmp_path / "tok"), str(tmp_path / "texts.json")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["special"] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    assert loaded["size"] == VOCAB_SIZE
    assert loaded["ids"] == [_spec_ids(text) for text in TEXTS]
    assert loaded["decoded"] == TEXTS
