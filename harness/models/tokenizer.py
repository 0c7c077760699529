"""The builtin tokenizer: byte-level BPE trained with ``tokenizers``, ChatML special tokens and chat template.

Digits are split one per token (so ``1 2 + 7`` and ``12 + 7`` tokenize digit by digit, as the seed's arithmetic
format intends). The result is a ``PreTrainedTokenizerFast`` that saves with ``save_pretrained`` and reloads with
``AutoTokenizer.from_pretrained(...)``, ``apply_chat_template`` included.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

IM_START, IM_END, PAD, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|pad|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, ENDOFTEXT, IM_START, IM_END]
# ChatML. Prefix-consistent: rendering messages[:k] is a prefix of rendering messages, which the label masking
# (harness.data.batches) relies on to find each assistant turn's characters.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts``; deterministic for the same texts and settings."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, ENDOFTEXT],
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
