"""Replicas of `stageml serve` on Ray Serve, adapters multiplexed over them.

    import ray, stageml.serve.ray
    from ray import serve
    serve.run(stageml.serve.ray.app("out/llama.vmfb", {"tenant-a": "adapters/a", "tenant-b": "adapters/b"},
                                    replicas=2, adapters_per_replica=4), route_prefix="/")
    curl localhost:8000/v1/completions -H 'serve_multiplexed_model_id: tenant-a' \\
         -d '{"model": "tenant-a", "prompt": [1, 5, 9], "max_tokens": 32}'

    serve run stageml.serve.ray:build module=out/llama.vmfb adapters=tenant-a=adapters/a,tenant-b=adapters/b \\
        replicas=2 adapters_per_replica=4                     # the same from Ray's CLI

Each replica is the embedded server's app (serve/api.py) over an engine of its
own. The adapters are a catalog fixed at deployment, none loaded at start: a
request names its adapter as Ray's multiplexed model id (the header
`serve_multiplexed_model_id`, set to the body's `model`), Ray routes it to a
replica that holds the adapter, and a replica that does not loads it
(`serve.multiplexed`: at most `adapters_per_replica` a replica, the least
recently used unloaded first; one still in use by running requests stays
registered with the module, whose own slots and LRU bound its memory).
Responses name their replica (header x-stageml-replica) and, for an adapter's
request, whether it loaded the adapter (x-stageml-adapter-loaded: 1 or 0).
Requests for the base model need no header. README "Serving on Ray" says how
this runs on a multi-node cluster.
"""

import asyncio
import os

from ray import serve

from stageml.errors import AdapterError, InputError
from stageml.serve import open_generator, read_tokenizer
from stageml.serve.api import build_app
from stageml.serve.engine import AdapterInUse, Engine


class _Resident:
    """An adapter a replica holds for Ray's multiplexing; unloaded when Ray drops it (LRU)."""

    def __init__(self, engine: Engine, name: str, loaded: bool):
        self.engine, self.name, self.held = engine, name, True
        self.loaded = loaded  # whether this replica loaded it for this (until the first request says so)

    def __del__(self):  # called by Ray when it drops the adapter, then by the collector: once is enough
        if self.held:
            self.held = False
            try:
                self.engine.unload_adapter(self.name)
            except (AdapterInUse, AdapterError):  # in use: it stays registered; unknown: already gone
                pass


def app(module: str, adapters: dict, replicas: int = 2, adapters_per_replica: int = 4,
        model_name: str | None = None, tokenizer: str | None = None, ray_actor_options: dict | None = None,
        **serving):
    """The Ray Serve application: `replicas` replicas of the generation step at `module`, serving
    the base model (as `model_name`, default the file's stem) and the catalog `adapters`
    ({name: PEFT directory}, every path readable on every node). `ray_actor_options`: each
    replica's resources, as Ray takes them (e.g. {"num_cpus": 4}); `serving`: stageml.load's options."""
    name = model_name or os.path.splitext(os.path.basename(module))[0]

    @serve.deployment(name="stageml", num_replicas=replicas, ray_actor_options=ray_actor_options)
    @serve.ingress()
    class StageMLReplica:
        def __init__(self):
            self.engine = Engine(open_generator(module, {}, **serving)).start()

        @serve.multiplexed(max_num_models_per_replica=adapters_per_replica)
        async def resident(self, adapter: str) -> _Resident:
            loaded = await asyncio.to_thread(self.engine.load_adapter, adapter, adapters[adapter], exist_ok=True)
            return _Resident(self.engine, adapter, loaded)

        async def load(self, adapter: str) -> bool:
            resident = await self.resident(adapter)
            fresh, resident.loaded = resident.loaded, False
            return fresh

        def __serve_build_asgi_app__(self):
            replica = serve.get_replica_context().replica_id.unique_id
            return build_app(self.engine, name, adapters, read_tokenizer(tokenizer) if tokenizer else None,
                             root=os.path.abspath(module), loader=self.load, replica=replica)

        def __del__(self):
            self.engine.stop()

    return StageMLReplica.bind()


def build(args: dict):
    """`serve run stageml.serve.ray:build module=... adapters=NAME=DIR,... replicas=N adapters_per_replica=N
    [model_name=...] [tokenizer=...]`: app() from Ray's string arguments."""
    if "module" not in args:
        raise InputError("stageml.serve.ray:build needs module=PATH (the .vmfb stagemlc --generate wrote)")
    adapters = dict(item.split("=", 1) for item in args.get("adapters", "").split(",") if item)
    return app(args["module"], adapters, int(args.get("replicas", 2)), int(args.get("adapters_per_replica", 4)),
               args.get("model_name"), args.get("tokenizer"))
