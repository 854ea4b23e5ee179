"""StageML inside other frameworks: `stageml.torch` (interop/torch.py) puts a staged
residual into a PyTorch program as a custom op."""
