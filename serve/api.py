"""The HTTP API of `stageml serve`: OpenAI's completions and models routes, the LoRA
adapter routes multi-LoRA servers share, health and Prometheus metrics.

    POST /v1/completions          {"model": "tenant-a", "prompt": [1, 5, 9], "max_tokens": 32, "stream": false}
    GET  /v1/models               the base model and every adapter (its parent the base)
    POST /v1/load_lora_adapter    {"lora_name": "tenant-c", "lora_path": "adapters/c"}
    POST /v1/unload_lora_adapter  {"lora_name": "tenant-c"}
    GET  /health                  200 while the engine runs
    GET  /metrics                 Prometheus text (serve/metrics.py)

`model` names an adapter or the base model. A prompt is token ids, or text where
the server has a tokenizer (a local tokenizer.json), or a list of either (one
choice each). Each choice carries the generated `token_ids` beside `text`.
`temperature` 0 is greedy (the default is OpenAI's 1.0); `seed` fixes the draws;
`stop_token_ids` and `ignore_eos` as vLLM takes them. With `"stream": true`
the choices arrive as server-sent events, a chunk per step, then `data: [DONE]`.
Errors are OpenAI's {"error": {"message", "type", "param", "code"}} with a
4xx status and a one-line message; a request's error never touches another
request, and a client that disconnects frees its sequences at the next step.
"""

import asyncio
import json
import time
import uuid
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from stageml.errors import AdapterError, InputError
from stageml.runtime.generation import Sequence
from stageml.serve.engine import AdapterInUse
from stageml.serve.metrics import Metrics

DISCONNECT_POLL = 0.05  # seconds between checks that a waiting (non-streaming) client is still there


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class CompletionRequest(BaseModel):
    """OpenAI's completion request; fields StageML does not implement are refused if set."""
    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(16, ge=1)
    temperature: float | None = Field(1.0, ge=0, le=2)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    user: StrictStr | None = None
    # OpenAI's, not implemented: refused unless left at their defaults (UNSUPPORTED)
    n: int = 1
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    stop: str | list[str] | None = None


UNSUPPORTED = {"n": (1, "pass n=1 (one choice a prompt)"), "best_of": (None, "leave best_of out"),
               "echo": (False, "leave echo out"), "logprobs": (None, "leave logprobs out"),
               "suffix": (None, "leave suffix out"), "stop": (None, "pass stop_token_ids instead")}


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr = Field(min_length=1)
    lora_path: StrictStr = Field(min_length=1)


class UnloadAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr = Field(min_length=1)


def build_app(engine, model_name: str, adapters: dict | None = None, tokenizer=None, root: str = "",
              loader=None, replica: str | None = None) -> FastAPI:
    """The server's app over a started Engine. `model_name`: the base model's name in requests;
    `adapters`: {name: PEFT directory} the server serves; `tokenizer`: a tokenizers.Tokenizer, or
    None (token ids only); `root`: what /v1/models names as the base model's source.

    `loader`: None where `adapters` are loaded already (and the load/unload routes change them);
    else an async function that makes adapter `name` servable here before its request runs and
    says whether it loaded it now (Ray Serve's multiplexed loader, serve/ray.py; `adapters` is
    then the deployment's fixed catalog). `replica`: a name every response carries as the header
    x-stageml-replica."""
    app = FastAPI(title="stageml serve", docs_url=None, redoc_url=None)
    if replica is not None:
        @app.middleware("http")
        async def name_the_replica(request: Request, call_next):
            response = await call_next(request)
            response.headers["x-stageml-replica"] = replica
            return response
    metrics = Metrics(engine)
    engine.on_step = metrics.step
    paths = dict(adapters or {})
    created = int(time.time())
    generator = engine.generator

    def reject(error: ApiError) -> JSONResponse:
        metrics.rejected.labels(str(error.status)).inc()
        return JSONResponse({"error": {"message": error.message, "type": error.kind, "param": error.param,
                                       "code": error.status}}, status_code=error.status)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return reject(error)

    @app.get("/health")
    async def health():
        if not engine.alive:
            return PlainTextResponse("the engine has stopped", status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus():
        return Response(await asyncio.to_thread(metrics.exposition), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        card = {"object": "model", "created": created, "owned_by": "stageml", "max_model_len": generator.max_seq}
        return {"object": "list", "data": [{"id": model_name, "root": root, "parent": None, **card}] +
                [{"id": n, "root": path, "parent": model_name, **card} for n, path in paths.items()]}

    def updatable() -> None:
        if not engine.tenants:
            raise ApiError(400, "this model was compiled without adapter slots: compile with --max-adapters to "
                                "serve adapters")
        if loader is not None:
            raise ApiError(400, "this deployment serves a fixed catalog of adapters, loaded on demand: deploy it "
                                "again with the adapter in its catalog")

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await _parsed(request, LoadAdapter)
        updatable()
        if body.lora_name == model_name:
            raise ApiError(400, f"{body.lora_name!r} is the base model's name: pick another adapter name")
        try:
            await asyncio.to_thread(engine.load_adapter, body.lora_name, body.lora_path)
        except AdapterError as e:
            raise ApiError(400, str(e), param="lora_path") from None
        paths[body.lora_name] = body.lora_path
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body = await _parsed(request, UnloadAdapter)
        updatable()
        if body.lora_name not in paths:
            raise ApiError(404, f"adapter {body.lora_name!r} is not loaded: GET /v1/models lists the adapters",
                           kind="not_found_error", param="lora_name")
        try:
            await asyncio.to_thread(engine.unload_adapter, body.lora_name)
        except AdapterInUse as e:
            raise ApiError(409, str(e), kind="conflict_error", param="lora_name") from None
        except AdapterError as e:
            raise ApiError(404, str(e), kind="not_found_error", param="lora_name") from None
        paths.pop(body.lora_name, None)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrived = time.perf_counter()
        body = await _parsed(request, CompletionRequest)
        if body.model != model_name and body.model not in paths:
            raise ApiError(404, f"the model {body.model!r} does not exist: GET /v1/models lists the base model "
                                "and the adapters", kind="not_found_error", param="model")
        for field, (default, fix) in UNSUPPORTED.items():
            if getattr(body, field) not in (default, "", []):
                raise ApiError(400, f"{field}: StageML does not implement it: {fix}", param=field)
        prompts = _prompts(body.prompt, tokenizer)
        adapter = None if body.model == model_name else body.model
        ends = frozenset(body.stop_token_ids or ()) | (frozenset() if body.ignore_eos else frozenset(generator.eos))
        temperature = 1.0 if body.temperature is None else body.temperature
        sequences = [Sequence(p, adapter, body.max_tokens or max(generator.max_seq - len(p), 1), temperature, ends,
                              body.seed if body.seed is None or len(prompts) == 1 else (body.seed, i))
                     for i, p in enumerate(prompts)]
        labels = ["the prompt"] if len(sequences) == 1 else [f"prompt {i}" for i in range(len(sequences))]
        try:  # before the adapter loads, so that a bad request loads nothing
            for sequence, label in zip(sequences, labels):
                generator.check(sequence, label)
        except InputError as e:
            raise ApiError(400, str(e), param="prompt") from None
        headers = {}
        if loader is not None and adapter is not None:
            try:
                headers["x-stageml-adapter-loaded"] = str(int(await loader(adapter)))
            except AdapterError as e:
                raise ApiError(400, str(e), param="model") from None
        loop, updates = asyncio.get_running_loop(), asyncio.Queue()

        def listener(index: int):
            sent = 0

            def update(sequence: Sequence) -> None:  # on the engine thread
                nonlocal sent
                tokens, sent = sequence.tokens[sent:], len(sequence.tokens)
                loop.call_soon_threadsafe(updates.put_nowait,
                                          (index, tokens, sequence.finish, sequence.error, time.perf_counter()))
            return update

        for i, (sequence, label) in enumerate(zip(sequences, labels)):
            engine.submit(sequence, listener(i), label)
        metrics.prompt_tokens.labels(body.model).inc(sum(len(p) for p in prompts))
        run = _Run(body, sequences, updates, metrics, arrived, tokenizer,
                   f"cmpl-{uuid.uuid4().hex}", int(time.time()))
        if body.stream:
            return StreamingResponse(run.events(engine), media_type="text/event-stream", headers=headers)
        done = await run.response(engine, request)
        return Response(status_code=499) if done is None else JSONResponse(done, headers=headers)

    return app


async def _parsed(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request's JSON body as `model` (whatever its content type says, as curl -d sends it)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            raise ApiError(400, f"the body is not valid JSON ({first['ctx']['error']}): send a JSON object") from None
        where = str(first["loc"][0]) if first["loc"] else "the body"
        message = ("pass token ids, text, or a list of either" if where == "prompt" and len(first["loc"]) > 1
                   else first["msg"][0].lower() + first["msg"][1:])
        raise ApiError(400, f"{where}: {message}", param=None if where == "the body" else where) from None


def _prompts(prompt, tokenizer) -> list:
    """The request's prompts as lists of token ids (text through the tokenizer)."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise ApiError(400, "prompt is empty: pass token ids or text", param="prompt")
    if any(isinstance(p, str) for p in prompt):
        if tokenizer is None:
            raise ApiError(400, "prompt: this server takes token ids only (it has no tokenizer): send token ids, "
                                "or start it with --tokenizer tokenizer.json", param="prompt")
        return [tokenizer.encode(p).ids for p in prompt]
    return [list(p) for p in prompt]


class _Run:
    """One completion request's sequences, as their updates arrive from the engine."""

    def __init__(self, body, sequences, updates, metrics, arrived, tokenizer, rid, created):
        self.body, self.sequences, self.updates, self.metrics = body, sequences, updates, metrics
        self.arrived, self.tokenizer, self.id, self.created = arrived, tokenizer, rid, created
        model = body.model  # its metrics' labelled series, found once
        self.generated = metrics.generation_tokens.labels(model)
        self.first_token = metrics.time_to_first_token.labels(model)
        self.between_tokens = metrics.inter_token_latency.labels(model)
        self.latency = metrics.e2e_request_latency.labels(model)
        self.last = [None] * len(sequences)  # each sequence's latest token time
        self.tokens = [[] for _ in sequences]  # each sequence's tokens as its updates brought them
        self.texts = [""] * len(sequences)
        self.finish = [None] * len(sequences)

    async def _next(self):
        """The next update; records its metrics; raises ApiError(500) where its call failed."""
        index, tokens, finish, error, at = await self.updates.get()
        self.tokens[index] += tokens
        self.finish[index] = finish
        if tokens:
            self.generated.inc(len(tokens))
            if self.last[index] is None:
                self.first_token.observe(at - self.arrived)
            else:
                self.between_tokens.observe((at - self.last[index]) / len(tokens))
            self.last[index] = at
        if finish is not None:
            self.metrics.requests.labels(self.body.model, finish).inc()
            self.latency.observe(at - self.arrived)
        if isinstance(error, InputError):  # (its adapter unloaded between the request's check and its start)
            raise ApiError(400, str(error), param="model")
        if error is not None:
            raise ApiError(500, f"the model call failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}",
                           kind="server_error")
        return index, tokens, finish

    def _text(self, index: int) -> str:
        """The text of sequence `index`'s tokens not yet returned (a token that ends
        mid-character waits for the next)."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.tokens[index], skip_special_tokens=True)
        if text.endswith("\ufffd") and self.finish[index] is None:
            return ""
        delta, self.texts[index] = text[len(self.texts[index]):], text
        return delta

    def _usage(self) -> dict:
        prompt = sum(len(s.prompt) for s in self.sequences)
        completion = sum(len(t) for t in self.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _abort(self, engine) -> None:
        aborted = self.metrics.requests.labels(self.body.model, "abort")
        for sequence, finish in zip(self.sequences, self.finish):
            if finish is None:
                engine.abort(sequence).add_done_callback(lambda done: done.cancelled() or done.result() and aborted.inc())

    async def response(self, engine, request: Request) -> dict | None:
        """The whole completion, once every sequence has ended; None (its sequences aborted) if
        the client leaves first."""
        open_ = len(self.sequences)
        try:
            while open_:
                try:
                    _, _, finish = await asyncio.wait_for(self._next(), DISCONNECT_POLL)
                except TimeoutError:
                    if await request.is_disconnected():
                        return None
                    continue
                open_ -= finish is not None
        finally:
            self._abort(engine)
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.body.model,
                "choices": [{"index": i, "text": self._text(i), "token_ids": self.tokens[i], "logprobs": None,
                             "finish_reason": self.finish[i]} for i in range(len(self.sequences))],
                "usage": self._usage()}

    async def events(self, engine):
        """Server-sent events: a chunk per sequence per step, then [DONE]; a disconnect
        (the stream's task cancelled) aborts the sequences."""
        open_ = len(self.sequences)
        try:
            while open_:
                try:
                    index, tokens, finish = await self._next()
                except ApiError as e:
                    yield _event({"error": {"message": e.message, "type": e.kind, "param": None, "code": e.status}})
                    break
                open_ -= finish is not None
                yield _event({"id": self.id, "object": "text_completion", "created": self.created,
                              "model": self.body.model, "choices": [{"index": index, "text": self._text(index),
                                                                     "token_ids": tokens, "logprobs": None,
                                                                     "finish_reason": finish}]})
            if self.body.stream_options is not None and self.body.stream_options.include_usage:
                yield _event({"id": self.id, "object": "text_completion", "created": self.created,
                              "model": self.body.model, "choices": [], "usage": self._usage()})
            yield "data: [DONE]\n\n"
        finally:
            self._abort(engine)


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
