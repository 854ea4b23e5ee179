"""The few vLLM modules its Triton LoRA ops import, stubbed for the H200 peer
benchmark (peer.py). vLLM's own ops are copied from the vllm==0.33.0 wheel
by prepare.py at prepare time into the artifacts directory, never into the
repository; these stubs carry vLLM's defaults."""
