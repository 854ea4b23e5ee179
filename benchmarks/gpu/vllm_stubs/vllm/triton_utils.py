"""vllm.triton_utils: Triton itself."""
import triton
import triton.language as tl

__all__ = ["tl", "triton"]
