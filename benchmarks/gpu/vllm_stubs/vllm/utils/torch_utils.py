"""vllm.utils.torch_utils: a host-to-device copy, and no custom-op registration
(the ops then fall back to their plain Python functions, as vLLM's own
code does when registration is unavailable)."""
import torch


def async_tensor_h2d(data, device=None, dtype=None, out=None):
    t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype, device="cpu")
    if out is not None:
        return out.copy_(t, non_blocking=True)
    return t.to(device=device, dtype=dtype, non_blocking=True)


def direct_register_custom_op(*args, **kwargs):
    return None
