"""`stageml serve`: a compiled generation step behind an OpenAI-compatible HTTP endpoint.

    stageml serve out/llama.vmfb --adapter tenant-a=adapters/a --host 127.0.0.1 --port 8000
    curl localhost:8000/v1/completions -d '{"model": "tenant-a", "prompt": [1, 5, 9], "max_tokens": 32}'

One process: uvicorn serves the FastAPI app (serve/api.py) on its event loop,
and the engine (serve/engine.py) runs the model's steps on a thread of its own,
batching the requests of every tenant into shared decode steps. `stageml.serve.ray`
runs replicas of the same on Ray Serve.
"""

import os
import socket

from stageml.errors import InputError, ModelLoadError, StageMLError


def open_generator(path: str, adapters: dict, **serving):
    """The Generator of the compiled step at `path`, with `adapters` ({name: PEFT directory}) loaded."""
    import stageml

    generator = stageml.load(path, **serving)
    if not hasattr(generator, "generate"):
        raise InputError(f"{path!r} is no generation step: compile the model with stagemlc --generate to serve it")
    if adapters and generator.module.tenants is None:
        raise InputError(f"{path!r} has no adapter slots: compile it with --max-adapters N to serve adapters")
    for name, directory in adapters.items():
        generator.load_adapter(name, directory)
    return generator


def read_tokenizer(path: str):
    """A tokenizers.Tokenizer from a local tokenizer.json."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as e:
        raise ModelLoadError(f"--tokenizer {path!r} does not load ({str(e).splitlines()[0] if str(e) else e!r}): "
                             "pass a tokenizer.json file") from None


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one)."""
    sock = None
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except (OSError, UnicodeError) as e:
        if sock is not None:
            sock.close()
        raise StageMLError(f"cannot listen on {host}:{port} ({getattr(e, 'strerror', None) or e}): "
                           "pick another --host or --port") from None
    return sock


def serve(path: str, adapters: dict | None = None, host: str = "127.0.0.1", port: int = 8000,
          model_name: str | None = None, tokenizer: str | None = None, log_level: str = "warning",
          on_listen=None, **serving) -> None:
    """Serves the generation step at `path` until interrupted. `adapters`: {name: PEFT directory}
    to load first; `model_name`: the base model's name in requests (default: the file's stem);
    `tokenizer`: a tokenizer.json for text prompts; `on_listen(url)`: called once listening;
    `serving`: stageml.load's options (adapter_memory_budget, policy, ...)."""
    import uvicorn

    from stageml.serve.api import build_app
    from stageml.serve.engine import Engine

    adapters = dict(adapters or {})
    model_name = model_name or os.path.splitext(os.path.basename(path))[0]
    if model_name in adapters:
        raise InputError(f"adapter name {model_name!r} is the base model's name: rename the adapter or pass "
                         "--served-model-name")
    words = read_tokenizer(tokenizer) if tokenizer is not None else None
    sock = listen(host, port)
    try:
        engine = Engine(open_generator(path, adapters, **serving)).start()
        try:
            app = build_app(engine, model_name, adapters, words, root=os.path.abspath(path))
            server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
            if on_listen is not None:
                on_listen(f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}")
            server.run(sockets=[sock])
        finally:
            engine.stop()
    finally:
        sock.close()
