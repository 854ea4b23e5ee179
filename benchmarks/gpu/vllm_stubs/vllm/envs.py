"""vllm.envs: the four settings the LoRA ops read, at vLLM 0.33's defaults."""
VLLM_LORA_ENABLE_DUAL_STREAM = False
VLLM_BATCH_INVARIANT = False
VLLM_TUNED_CONFIG_FOLDER = None
VLLM_LORA_DISABLE_PDL = False
