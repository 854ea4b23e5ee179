"""Command-line tools: stagemlc (the compiler) and stageml-opt (pass runner)."""

import logging
import warnings


def quiet_dependencies() -> None:
    """Silences what the libraries a command imports say about themselves rather than about its
    input: deprecation warnings, and the log lines transformers' import of torchao (where it is
    installed) writes (torchao's optional CUDA extensions not loading, torch deprecating a
    registration torchao makes). The command's output is its own."""
    warnings.simplefilter("ignore")
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
