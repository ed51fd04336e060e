"""Hugging Face models built from config, for ``coloc-estimate --model examples/hf_models.py:NAME``.

No weights are downloaded: memory depends on the architecture, not on the values. Each builder
returns the Hugging Face model itself; the estimator calls ``model(ids)`` and takes the output's
``.logits`` (docs/user.md). Token models take ``--input-shape SEQ --input-dtype int64``::

    coloc-estimate --model examples/hf_models.py:gpt2 --input-shape 512 --input-dtype int64 \\
        --batch-size 8 --optimizer adamw
    coloc-estimate --model examples/hf_models.py:llama --model-kwargs '{"layers": 8}' \\
        --input-shape 1024 --input-dtype int64 --batch-size 4 --optimizer adamw --bf16
    coloc-estimate --model examples/hf_models.py:vit --input-shape 3,224,224 --batch-size 32 --optimizer adamw

Causal LMs are built with ``use_cache=False`` (training does not keep a KV cache). Their
transformers code checks the position ids for packed sequences with a data-dependent read; the
estimator assumes an ordinary (unpacked, unpadded) batch and reports ``assumed_values`` in the
estimate's detail.
"""
from __future__ import annotations

from typing import Any


def gpt2(layers: int = 12, hidden: int = 768, heads: int = 12, vocab: int = 50257,
         positions: int = 1024) -> Any:
    """GPT-2 (``GPT2LMHeadModel``; defaults: GPT-2 small, 124M)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab,
                                      n_positions=positions, use_cache=False))


def gpt_neox(layers: int = 6, hidden: int = 512, heads: int = 8, vocab: int = 50304) -> Any:
    """GPT-NeoX (``GPTNeoXForCausalLM``; defaults: Pythia-70M)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=layers, hidden_size=hidden,
                                            num_attention_heads=heads,
                                            intermediate_size=4 * hidden, vocab_size=vocab, use_cache=False))


def llama(layers: int = 4, hidden: int = 512, heads: int = 8, kv_heads: int = 4, vocab: int = 32000) -> Any:
    """Llama (``LlamaForCausalLM``; a small config with grouped-query attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, hidden_size=hidden,
                                        num_attention_heads=heads,
                                        num_key_value_heads=kv_heads, intermediate_size=int(2.75 * hidden),
                                        vocab_size=vocab, use_cache=False))


def mistral(layers: int = 4, hidden: int = 512, heads: int = 8, kv_heads: int = 2, vocab: int = 32000) -> Any:
    """Mistral (``MistralForCausalLM``; a small config)."""
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(num_hidden_layers=layers, hidden_size=hidden,
                                            num_attention_heads=heads,
                                            num_key_value_heads=kv_heads, intermediate_size=int(3.5 * hidden),
                                            vocab_size=vocab, use_cache=False))


def qwen2(layers: int = 4, hidden: int = 512, heads: int = 8, kv_heads: int = 2, vocab: int = 151936) -> Any:
    """Qwen2 (``Qwen2ForCausalLM``; a small config, Qwen2's large vocabulary)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=layers, hidden_size=hidden,
                                        num_attention_heads=heads,
                                        num_key_value_heads=kv_heads, intermediate_size=int(2.75 * hidden),
                                        vocab_size=vocab, use_cache=False))


def bert(layers: int = 12, hidden: int = 768, heads: int = 12, labels: int = 2, vocab: int = 30522) -> Any:
    """BERT (``BertForSequenceClassification``; defaults: bert-base)."""
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(num_hidden_layers=layers, hidden_size=hidden,
                                                    num_attention_heads=heads, intermediate_size=4 * hidden,
                                                    vocab_size=vocab, num_labels=labels))


def roberta(layers: int = 12, hidden: int = 768, heads: int = 12, vocab: int = 50265) -> Any:
    """RoBERTa (``RobertaForMaskedLM``; defaults: roberta-base)."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    return RobertaForMaskedLM(RobertaConfig(num_hidden_layers=layers, hidden_size=hidden,
                                            num_attention_heads=heads,
                                            intermediate_size=4 * hidden, vocab_size=vocab,
                                            max_position_embeddings=514))


def distilbert(labels: int = 2) -> Any:
    """DistilBERT (``DistilBertForSequenceClassification``; distilbert-base)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    return DistilBertForSequenceClassification(DistilBertConfig(num_labels=labels))


def albert(labels: int = 2) -> Any:
    """ALBERT (``AlbertForSequenceClassification``; albert-base-v2 sizes)."""
    from transformers import AlbertConfig, AlbertForSequenceClassification

    return AlbertForSequenceClassification(AlbertConfig(hidden_size=768, num_attention_heads=12,
                                                        intermediate_size=3072, num_labels=labels))


def electra(labels: int = 2) -> Any:
    """ELECTRA (``ElectraForSequenceClassification``; electra-small discriminator sizes)."""
    from transformers import ElectraConfig, ElectraForSequenceClassification

    return ElectraForSequenceClassification(ElectraConfig(num_labels=labels))


def t5_encoder(layers: int = 6, d_model: int = 512, heads: int = 8, labels: int = 2,
               vocab: int = 32128) -> Any:
    """T5 encoder (``T5EncoderModel``, t5-small sizes) with a mean-pooled linear head."""
    import torch
    from transformers import T5Config, T5EncoderModel

    class T5Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = T5EncoderModel(T5Config(num_layers=layers, d_model=d_model, num_heads=heads,
                                                   d_ff=4 * d_model, vocab_size=vocab, use_cache=False))
            self.head = torch.nn.Linear(d_model, labels)

        def forward(self, ids: Any) -> Any:
            return self.head(self.encoder(input_ids=ids).last_hidden_state.mean(dim=1))

    return T5Classifier()


def vit(layers: int = 12, hidden: int = 768, heads: int = 12, labels: int = 1000, image: int = 224) -> Any:
    """ViT (``ViTForImageClassification``; defaults: ViT-B/16); input ``3,224,224`` float32."""
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(num_hidden_layers=layers, hidden_size=hidden,
                                               num_attention_heads=heads,
                                               intermediate_size=4 * hidden, image_size=image,
                                               num_labels=labels))
