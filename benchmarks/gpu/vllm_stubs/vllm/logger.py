"""vllm.logger.init_logger: a standard logger with vLLM's *_once methods."""
import functools
import logging


class _Logger(logging.LoggerAdapter):
    @functools.lru_cache(None)
    def warning_once(self, msg, *args):
        self.warning(msg, *args)

    @functools.lru_cache(None)
    def info_once(self, msg, *args):
        self.info(msg, *args)


def init_logger(name):
    return _Logger(logging.getLogger(name), {})
