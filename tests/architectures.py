"""The causal-LM families of the installed transformers as tiny random-weight models, for the
architecture sweep (tests/test_architectures.py).

Every family in transformers' causal-LM mapping is built from its config class with the sizes
of SMALL (where the config has the attribute and lets it be set) and its own OVERRIDES (a
multimodal model's from its text model's, COMPOSITE); PEFT LoRA (r=4) goes on every linear
layer (PEFT's "all-linear", which on an MoE layer also takes the fused expert stacks, with
twice the rank on gate_up_proj; LORA_OVERRIDES leaves out what PEFT cannot wrap).
NOT_BUILT names the families that cannot be built that way here, and why.
"""

import warnings

import torch

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, head_dim=16, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, rotary_dim=8, is_decoder=True, num_experts=4, num_local_experts=4, n_routed_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=32, d_model=64, decoder_layers=2, decoder_attention_heads=4,
             decoder_ffn_dim=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128)

# MLA attention (DeepSeek V2/V3 and their kin): its own ranks and head dims, and as many KV heads
# as query heads (its keys' shared rope part is expanded to every head)
_MLA_SIZES = dict(kv_lora_rank=32, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                  head_dim=8, num_key_value_heads=4)
_MOE_GROUPS = dict(first_k_dense_replace=1, n_group=1, topk_group=1)
_BLT_LOCAL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
OVERRIDES = {  # family -> config values beside SMALL
    "deepseek_v2": dict(_MLA_SIZES, first_k_dense_replace=1),
    "deepseek_v3": dict(_MLA_SIZES, **_MOE_GROUPS), "deepseek_v32": dict(_MLA_SIZES, **_MOE_GROUPS),
    "axk1": dict(_MLA_SIZES, **_MOE_GROUPS),
    # its heads are per-layer attributes (SMALL's are not settable): its DSA (indexed) layer's set here, its sliding
    # layer's by its swa_ values (head_dim = nope + rope), and its indexer's heads
    "dots3_note_text": dict(_MLA_SIZES, num_attention_heads=4, index_n_heads=2, index_head_dim=16,
                            shared_experts_intermediate_size=32, layer_types=["indexed_attention", "sliding_attention"],
                            sliding_window=4, swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_q_lora_rank=32,
                            swa_kv_lora_rank=32, swa_head_dim=24, swa_qk_nope_head_dim=16, swa_v_head_dim=16),
    # its query and grouped output projections' ranks, its indexer's heads, and one layer of each attention and MoE
    # kind (its default depth's first two are both heavily compressed and hash-routed)
    "deepseek_v4": dict(q_lora_rank=32, o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16,
                        layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
                        mlp_layer_types=["hash_moe", "moe"]),
    "glm4_moe_lite": dict(_MLA_SIZES, **_MOE_GROUPS),
    "glm_moe_dsa": dict(_MLA_SIZES, **_MOE_GROUPS),
    "minicpm3": _MLA_SIZES, "longcat_flash": _MLA_SIZES, "axk2": _MLA_SIZES, "youtu": _MLA_SIZES,
    "dots1": dict(n_shared_experts=1),  # its config leaves the shared experts' count unset
    "zaya": dict(num_experts_per_tok=1),  # the only top-k it takes
    # configs that list per-layer values for their default depth: SMALL's 2 layers
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "lfm2_moe": dict(layer_types=["full_attention", "conv"]),
    "zamba": dict(layer_types=["hybrid", "hybrid"]),  # its one shared attention block is tied across two of them
    "zamba2": dict(layer_types=["linear_attention", "hybrid"]),
    "mllama_text_model": dict(cross_attention_layers=[1]),  # one of its cross-attention layers (text alone skips it)
    **dict.fromkeys(["gemma4_text", "gemma4_unified_text"],
                    dict(layer_types=["sliding_attention", "full_attention"], vocab_size_per_layer_input=128,
                         hidden_size_per_layer_input=16)),
    "gemma3n_text": dict(layer_types=["sliding_attention", "full_attention"], intermediate_size=[128, 128],
                         activation_sparsity_pattern=[0.0, 0.0], num_kv_shared_layers=0, vocab_size_per_layer_input=128,
                         hidden_size_per_layer_input=16, laurel_rank=8),
    "cohere_compass_text": dict(layer_types=["full_attention", "sliding_attention"],
                                rope_parameters=dict.fromkeys(["full_attention", "sliding_attention"],
                                                              {"rope_type": "default", "rope_theta": 10000.0})),
    # its depth is its attn_layers' length; its axial position embeddings take dims summing to hidden_size and a
    # shape multiplying to max_position_embeddings
    "reformer": dict(attn_layers=["local", "lsh"], axial_pos_embds_dim=[32, 32], axial_pos_shape=[8, 16],
                     attention_head_size=16, feed_forward_size=128),
    "mamba2": dict(num_heads=8),  # its heads x head_dim must be hidden_size x expand (64 x 2)
    "xlnet": dict(d_inner=128),  # its feed-forward size
    # its depths and decoder heads: its num_hidden_layers is derived, and refuses to be set
    "prophetnet": dict(num_encoder_layers=2, num_decoder_layers=2, num_decoder_attention_heads=4),
    # MusicGen's decoders (DECODER): one codebook, so that a row of ids is one sequence
    **dict.fromkeys(["musicgen_decoder", "musicgen_melody_decoder"], dict(num_codebooks=1, ffn_dim=128)),
    "dbrx": dict(attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},  # its sub-configs' sizes
                 ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}),
    # its sub-configs' sizes (SMALL sets the top level only), its local encoder's and decoder's width of the global
    # transformer (hidden_size_global, 2048 by default), and its hash embeddings' rows (500002 by default)
    "blt": dict(encoder_hash_byte_group_vocab=64, patcher_config=_BLT_LOCAL,
                encoder_config=dict(_BLT_LOCAL, hidden_size_global=64),
                decoder_config=dict(_BLT_LOCAL, hidden_size_global=64),
                global_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)),
}

# composite configs (a multimodal model's causal LM): family -> (its text model's type, whose tiny config is its
# text_config, and the other sub-configs' and top-level values)
_SIGLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
               patch_size=8)
COMPOSITE = {
    "gemma3": ("gemma3_text", dict(vision_config=_SIGLIP, mm_tokens_per_image=16)),
    **{f: (f"{f}_text", {}) for f in ("gemma4", "gemma4_unified")},
    "fuyu": ("persimmon", dict(patch_size=4)),
    # its causal LM is the text model's alone, but its config requires the towers' adapters to output the text width
    "dots3_note": ("dots3_note_text", dict(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=8, mlp_layer_types=["dense"], adapter_in_dim=32, adapter_out_dim=64),
        audio_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          downsample_hidden_size=16, adapter_input_size=32, adapter_out_dim=64))),
    # causal LMs of the text model alone: no vision tower to size
    **{f: (f"{f}_text", {}) for f in ("llama4", "qwen3_5", "qwen3_5_moe", "qwen4_exp")},
    "mllama": ("mllama_text_model", {}), "emu3": ("emu3_text_model", {}),
}

# causal LMs that take their decoder's config, not the family's composite one (MusicGen's): family -> the
# decoder's model type
DECODER = {"musicgen": "musicgen_decoder", "musicgen_melody": "musicgen_melody_decoder"}

# PEFT's all-linear wraps these routers, Linears whose forward returns a tuple, and the PEFT model
# fails in eager: their LoRA leaves the router out
LORA_OVERRIDES = {
    **dict.fromkeys(["phimoe", "llama4", "llama4_text"], dict(exclude_modules=["router"])),
    # PEFT refuses LoRA on a Mamba layer's out_proj (and conv1d, not a Linear): their LoRA leaves it out
    **dict.fromkeys(["mamba", "mamba2", "falcon_mamba", "falcon_h1", "nemotron_h"], dict(exclude_modules=["out_proj"])),
    # its grouped output projection (o_a_proj) is a Linear applied per group, whose LoRA PEFT sizes as one Linear's
    "deepseek_v4": dict(exclude_modules=["o_a_proj"]),
}

_DRAFTER = ("a Gemma 4 drafter: its config requires every layer to reuse the target model's KV states, and with that "
            "its text model's init fails (ValueError: the set of layer types producing a cache is different than the "
            "set using them); its forward takes the target's inputs_embeds and shared_kv_states, not token ids")
NOT_BUILT = {  # family -> why no tiny model of it is built here
    "gemma3n": "its vision tower needs timm and PIL, not installed",
    **dict.fromkeys(["gemma4_assistant", "gemma4_unified_assistant"], _DRAFTER),
}


def families() -> list:
    """The causal-LM model types of the installed transformers, less NOT_BUILT."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return [t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t not in NOT_BUILT]


def _settable(config, name: str) -> bool:
    from transformers.integrations.heterogeneity.configuration_utils import AmbiguousGlobalPerLayerAttributeError

    prop = getattr(type(config), name, None)
    try:
        present = hasattr(config, name)
    except AmbiguousGlobalPerLayerAttributeError:  # a per-layer value (Gemma 4's head_dim): the config's own
        return False
    if not present or not isinstance(prop, property):
        return present
    try:  # a derived value: settable unless read-only or its setter refuses (XLNet's max_position_embeddings)
        prop.__set__(config, getattr(config, name))
    except (AttributeError, NotImplementedError):
        return False
    return True


def tiny_config(model_type: str):
    """`model_type`'s config with SMALL's sizes and its OVERRIDES."""
    from transformers import AutoConfig

    if model_type in DECODER:
        return tiny_config(DECODER[model_type])
    cls = type(AutoConfig.for_model(model_type))
    if model_type in COMPOSITE:
        text, values = COMPOSITE[model_type]
        return cls(text_config=tiny_config(text).to_dict(), **values)
    default, names = cls(), getattr(cls, "attribute_map", {})
    values = {**{k: v for k, v in SMALL.items() if _settable(default, k)}, **OVERRIDES.get(model_type, {})}
    return cls(**{names.get(k, k): v for k, v in values.items()})


def tiny_peft_model(model_type: str, seed: int):
    """A tiny `model_type` causal LM with a random PEFT LoRA (r=4) on every linear layer."""
    from peft import LoraConfig, get_peft_model
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = tiny_config(model_type)
        if model_type in DECODER:  # AutoModelForCausalLM refuses the decoder's config class
            base = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])._from_config(config).eval()
        else:
            base = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():  # matrices a family initializes constant (AFMoE's router: zeros, every score a tie)
            for weight in base.parameters():
                if weight.dim() >= 2 and weight.is_floating_point() and bool((weight == weight.flatten()[0]).all()):
                    weight.normal_(0.0, 0.2)
        return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False,
                                               **LORA_OVERRIDES.get(model_type, {}))).eval()
