"""Build a tiny sliding-window (gpt-oss-like) target and its EAGLE3 draft, in seconds, offline.

    python e2e_swa_models.py FOLDER     # writes FOLDER/target and FOLDER/draft, prints both
    python e2e_swa_models.py FOLDER --check-with-transformers   # also loads both configs (and the
                                                               # target's weights) with transformers

The target is ``GptOssForCausalLM`` as SGLang 0.5.12 serves it (REFERENCE.md,
"A sliding-window (gpt-oss-like) server on the H200"): 4 layers whose
``layer_types`` alternate starting with ``sliding_attention`` (so layer 0, the
layer id an EAGLE3 draft's one layer also has, is a sliding-window layer),
``sliding_window`` 128, head dim 64, 8 query and 2 KV heads, 4 local experts
with 2 per token, attention biases and sinks, yarn rope (factor 32 over 4096,
``rope_theta`` 150000), ``swiglu_limit`` 7.0, bf16. Its tensors carry the names
of Hugging Face's gpt-oss checkpoints (``self_attn.{q,k,v,o}_proj.{weight,bias}``,
``self_attn.sinks``, ``mlp.router.{weight,bias}``, ``mlp.experts.gate_up_proj``
[E, H, 2I] and its bias [E, 2I], ``mlp.experts.down_proj`` [E, I, H] and its
bias [E, H], the two layer norms, ``model.embed_tokens``, ``model.norm``,
``lm_head``), written by hand rather than by transformers' ``save_pretrained``
so that no version's renaming can change them.

The draft is the one-layer ``LlamaForCausalLMEagle3`` of ``e2e_models`` (hidden
size = the target's), with ``max_position_embeddings`` 4096: the server runs
with ``--context-length 4096``, which SGLang refuses for a draft whose derived
context is shorter. Tokenizer: ``e2e_models``' byte-level BPE of 512 tokens.
Random weights, every parameter written (an uninitialised one could hold NaN).
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import e2e_models  # noqa: E402

VOCAB = e2e_models.VOCAB
HIDDEN = e2e_models.HIDDEN  # the draft's hidden size must be the target's
LAYERS, HEADS, KV_HEADS, HEAD_DIM = 4, 8, 2, 64
EXPERTS, EXPERTS_PER_TOKEN, EXPERT_INTERMEDIATE = 4, 2, 256
SLIDING_WINDOW = 128
CONTEXT = 4096
LAYER_TYPES = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(LAYERS)]


def target_config():
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": EXPERT_INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "layer_types": LAYER_TYPES,
        "sliding_window": SLIDING_WINDOW,
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "experts_per_token": EXPERTS_PER_TOKEN,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "swiglu_limit": 7.0,
        "hidden_act": "silu",
        "rope_theta": 150000,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "initial_context_length": 4096,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "router_aux_loss_coef": 0.9,
        "output_router_logits": False,
        "use_cache": True,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def target_weights(seed=0):
    import torch

    generator = torch.Generator().manual_seed(seed)

    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=generator) * std).to(torch.bfloat16)

    def ones(size):
        return torch.ones(size, dtype=torch.bfloat16)

    weights = {
        "model.embed_tokens.weight": normal(VOCAB, HIDDEN),
        "model.norm.weight": ones(HIDDEN),
        "lm_head.weight": normal(VOCAB, HIDDEN),
    }
    for layer in range(LAYERS):
        prefix = "model.layers.%d." % layer
        q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        weights.update(
            {
                prefix + "input_layernorm.weight": ones(HIDDEN),
                prefix + "post_attention_layernorm.weight": ones(HIDDEN),
                prefix + "self_attn.q_proj.weight": normal(q, HIDDEN),
                prefix + "self_attn.q_proj.bias": normal(q),
                prefix + "self_attn.k_proj.weight": normal(kv, HIDDEN),
                prefix + "self_attn.k_proj.bias": normal(kv),
                prefix + "self_attn.v_proj.weight": normal(kv, HIDDEN),
                prefix + "self_attn.v_proj.bias": normal(kv),
                prefix + "self_attn.o_proj.weight": normal(HIDDEN, q),
                prefix + "self_attn.o_proj.bias": normal(HIDDEN),
                prefix + "self_attn.sinks": normal(HEADS, std=1.0),
                prefix + "mlp.router.weight": normal(EXPERTS, HIDDEN),
                prefix + "mlp.router.bias": normal(EXPERTS),
                prefix + "mlp.experts.gate_up_proj": normal(EXPERTS, HIDDEN, 2 * EXPERT_INTERMEDIATE),
                prefix + "mlp.experts.gate_up_proj_bias": normal(EXPERTS, 2 * EXPERT_INTERMEDIATE),
                prefix + "mlp.experts.down_proj": normal(EXPERTS, EXPERT_INTERMEDIATE, HIDDEN),
                prefix + "mlp.experts.down_proj_bias": normal(EXPERTS, HIDDEN),
            }
        )
    return weights


def build_target(folder):
    from safetensors.torch import save_file

    save_file(target_weights(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(target_config(), indent=2))


def build(root):
    root = pathlib.Path(root)
    target, draft = root / "target", root / "draft"
    for folder in (target, draft):
        folder.mkdir(parents=True, exist_ok=True)
    size = e2e_models.build_tokenizer(target)
    assert size == VOCAB, size
    build_target(target)
    e2e_models.build_draft(draft, context=CONTEXT)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (draft / name).write_bytes((target / name).read_bytes())
    return target, draft


def check_with_transformers(target, draft):
    """Parse both configs with the transformers at hand and load the target's weights
    into its GptOssForCausalLM: no tensor missing, none left over (CPU, seconds)."""
    import transformers
    from transformers import AutoConfig, GptOssForCausalLM

    config = AutoConfig.from_pretrained(str(target))
    facts = {
        "transformers": transformers.__version__,
        "layer_types": config.layer_types,
        "sliding_window": config.sliding_window,
        "rope_parameters": config.rope_parameters,
        "swiglu_limit": getattr(config, "swiglu_limit", None),
        "head_dim": config.head_dim,
    }
    model, info = GptOssForCausalLM.from_pretrained(str(target), output_loading_info=True)
    facts["loading_info"] = {k: sorted(v) if isinstance(v, (set, list)) else str(v) for k, v in info.items()}
    draft_config = AutoConfig.from_pretrained(str(draft))
    facts["draft"] = {
        "architectures": draft_config.architectures,
        "max_position_embeddings": draft_config.max_position_embeddings,
    }
    return facts


if __name__ == "__main__":
    built = build(sys.argv[1])
    print(built)
    if "--check-with-transformers" in sys.argv:
        print(json.dumps(check_with_transformers(*built), indent=2, default=str))
