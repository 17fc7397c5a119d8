"""Build a tiny tokenizer, Llama target and EAGLE3 draft from code, in seconds, offline.

    python e2e_models.py FOLDER     # writes FOLDER/target and FOLDER/draft

Random weights: the server's output is meaningless text, which is all the
end-to-end test needs (the bug is about which KV range the draft attends to,
not about what the model says). Shapes, as they were seen to work with
SGLang 0.5.12 (REFERENCE.md): target ``LlamaForCausalLM`` with hidden 256,
4 layers (EAGLE3 captures aux hidden states after layers 0, 1, 2), 8 heads of
dim 128, 2 KV heads; draft ``LlamaForCausalLMEagle3`` with one layer whose
attention reads a 2H input, ``fc`` [H, 3H], ``hidden_norm``, ``lm_head``
[draft_vocab, H], ``d2t`` and ``t2d``; bf16 safetensors. Every parameter the
draft has is written (an uninitialised one could hold NaN and fake the bug).
"""

import json
import pathlib
import sys

VOCAB = 512
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 4, 8, 2, 128
CONTEXT = 2048
TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Speculative decoding drafts tokens with a small model and verifies them with a large one. " * 3,
    "CUDA graphs capture a sequence of kernels once and replay it many times. " * 3,
    "SGLang serves language models; a hotfix repairs one method without a new image. " * 3,
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`",
]


def build_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TEXT * 20, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": CONTEXT,
            }
        )
    )
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    return tokenizer.get_vocab_size()


def common_config(context=CONTEXT):
    return {
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def build_target(folder):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**dict(common_config(), num_hidden_layers=LAYERS, architectures=["LlamaForCausalLM"]))
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(folder), safe_serialization=True)


def build_draft(folder, context=CONTEXT):
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(1)

    def linear(rows, columns):
        return (torch.randn(rows, columns, generator=generator) * 0.02).to(torch.bfloat16)

    def ones(size):
        return torch.ones(size, dtype=torch.bfloat16)

    weights = {
        "embed_tokens.weight": linear(VOCAB, HIDDEN),
        "fc.weight": linear(HIDDEN, 3 * HIDDEN),
        "midlayer.self_attn.q_proj.weight": linear(HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": linear(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": linear(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": linear(HIDDEN, HEADS * HEAD_DIM),
        "midlayer.mlp.gate_proj.weight": linear(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.up_proj.weight": linear(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.down_proj.weight": linear(HIDDEN, INTERMEDIATE),
        "midlayer.input_layernorm.weight": ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": ones(HIDDEN),
        "midlayer.hidden_norm.weight": ones(HIDDEN),
        "norm.weight": ones(HIDDEN),
        "lm_head.weight": linear(VOCAB, HIDDEN),
        "d2t": torch.zeros(VOCAB, dtype=torch.int64),  # draft id + d2t = target id: the identity
        "t2d": torch.ones(VOCAB, dtype=torch.bool),
    }
    save_file(weights, str(folder / "model.safetensors"))
    config = dict(
        common_config(context),
        num_hidden_layers=1,
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=VOCAB,
        target_hidden_size=HIDDEN,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def build(root):
    root = pathlib.Path(root)
    target, draft = root / "target", root / "draft"
    for folder in (target, draft):
        folder.mkdir(parents=True, exist_ok=True)
    size = build_tokenizer(target)
    assert size == VOCAB, size
    build_target(target)
    build_draft(draft)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (draft / name).write_bytes((target / name).read_bytes())
    return target, draft


if __name__ == "__main__":
    print(build(sys.argv[1]))
