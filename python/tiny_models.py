"""Tiny random stand-ins for the examples' ``--smoke`` runs (and their tests): no downloads.

* :func:`byte_tokenizer` - a byte-level tokenizer (every UTF-8 byte one token, plus ChatML
  special tokens and a ChatML chat template), built in memory with ``tokenizers``;
* :func:`tiny_hf_model` - a random transformers Llama / Qwen2 / Mistral ``*ForCausalLM``
  sized for that tokenizer (hidden 64, GQA 4/2), what users get from ``AutoModelForCausalLM``.
"""

from __future__ import annotations

import torch

CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokenizer():
    """A transformers fast tokenizer over the 256 bytes + 3 special tokens (259 ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)


def tiny_hf_model(tokenizer, kind: str = "llama", layers: int = 7, seed: int = 0,
                  logit_scale: float = 8.0):
    """A random transformers ``{Llama,Qwen2,Mistral}ForCausalLM`` (fp32, CPU, eval mode).

    7 layers is the fewest an EAGLE-3 head accepts (it reads layers 2, N/2 and N-3).
    ``logit_scale`` multiplies lm_head: decisive distributions, few near-ties.
    """
    import transformers

    configs = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}
    models = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
              "mistral": transformers.MistralForCausalLM}
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = configs[kind](vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                           num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=4096,
                           eos_token_id=eos, bos_token_id=None,
                           pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = models[kind](config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def save_tiny_checkpoint(path, kind: str = "llama", layers: int = 7, seed: int = 0):
    """Write a tiny random target + its tokenizer as a HF checkpoint directory; returns it."""
    tokenizer = byte_tokenizer()
    model = tiny_hf_model(tokenizer, kind, layers, seed)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path
