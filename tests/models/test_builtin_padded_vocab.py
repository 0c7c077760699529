"""A builtin's embedding may have more rows than its tokenizer has tokens (``vocab_size`` in its config, as the
``qwen2.5-0.5b`` builtin asks for Qwen2.5's 151,936), never fewer."""

from __future__ import annotations

import pytest

from harness.config.schema import ModelSpec
from harness.models.builtin import QWEN2_5_0_5B_VOCAB, builtin_config


class _Tokenizer:
    """What builtin_config reads of a tokenizer."""

    pad_token_id, eos_token_id = 0, 3

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def test_qwen2_5_0_5b_has_qwen_s_shape_and_padded_vocabulary():
    config = builtin_config(ModelSpec(builtin="qwen2.5-0.5b", config={"num_hidden_layers": 2}), _Tokenizer(1317))
    assert config.vocab_size == QWEN2_5_0_5B_VOCAB == 151_936
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (896, 4864, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.tie_word_embeddings) == (14, 2, True)


def test_other_builtins_keep_one_row_per_token_and_fewer_rows_are_refused():
    assert builtin_config(ModelSpec(builtin="qwen2-tiny"), _Tokenizer(777)).vocab_size == 777
    assert (
        builtin_config(ModelSpec(builtin="qwen2-tiny", config={"vocab_size": 1000}), _Tokenizer(777)).vocab_size == 1000
    )
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        builtin_config(ModelSpec(builtin="qwen2-tiny", config={"vocab_size": 500}), _Tokenizer(777))
