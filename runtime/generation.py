"""Generation with a compiled step (compiler/generation.py) and the KV cache its module keeps.

    gen = stageml.load("out/llama.vmfb")               # compiled with generate=True
    out = gen.generate([[1, 5, 9], [7]], max_new_tokens=32)          # greedy
    out = gen.generate(prompts, adapters=["tenant-a", None], temperature=0.8, seed=0)

Each sequence holds one of the module's cache slots while it runs. Its prompt
is one step of all its tokens (prefill); then every step feeds each running
sequence's last token at its own position, all in one call (decode). A
sequence leaves when it has its tokens (or emits an end-of-sequence token), and a
waiting prompt takes its slot at once: continuous batching over the slots.
"""

import numpy as np

from stageml.errors import InputError


class Generator:
    """A loaded generation step: `generate` and, for a multi-tenant residual, its adapters
    (`load_adapter`, `unload_adapter`, `adapters`, `stats`)."""

    def __init__(self, module):
        self.module = module
        config = module.generation
        self.sequences, self.max_seq = config["sequences"], config["max_seq"]
        names = [spec["name"] for spec in module.inputs]
        self._order = [names.index(config[role]) for role in ("tokens", "slots", "positions")]
        self._tenants = hasattr(module, "run_batch")

    def __getattr__(self, name):
        if name in ("load_adapter", "unload_adapter", "adapters", "stats", "plan") and self._tenants:
            return getattr(self.module, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def step(self, tokens, slots, positions, adapters=None) -> np.ndarray:
        """One call: row b's tokens [B, T] at positions[b].. of cache slot slots[b]; its logits [B, T, V].
        `adapters`: each row's adapter (a multi-tenant residual; None: the base model)."""
        try:
            tokens, slots, positions = (np.ascontiguousarray(v, np.int64) for v in (tokens, slots, positions))
        except (TypeError, ValueError, OverflowError):
            raise InputError("a step takes integer token ids [B, T], slots [B] and positions [B]: pass those") from None
        if tokens.ndim != 2 or slots.shape != positions.shape or slots.shape != tokens.shape[:1]:
            raise InputError(f"a step takes token ids [B, T] with B slots and B positions, not shapes "
                             f"{list(tokens.shape)}, {list(slots.shape)} and {list(positions.shape)}: pass one row each")
        if slots.min(initial=0) < 0 or slots.max(initial=0) >= self.sequences:
            raise InputError(f"cache slot {int(slots.max() if slots.max() >= self.sequences else slots.min())} is "
                             f"outside 0..{self.sequences - 1}: the module was compiled for {self.sequences} sequences")
        if positions.min(initial=0) < 0:
            raise InputError(f"position {int(positions.min())} is negative: positions count from 0")
        if (positions + tokens.shape[1]).max(initial=0) > self.max_seq:
            raise InputError(f"tokens at positions up to {int((positions + tokens.shape[1]).max()) - 1} do not fit "
                             f"a cache of {self.max_seq} positions: compile with a larger max_seq")
        inputs = [None] * 3
        for value, index in zip((tokens, slots, positions), self._order):
            inputs[index] = value
        if self._tenants:
            return np.asarray(self.module.run_batch(tuple(inputs), list(adapters or [None] * len(tokens))))
        if adapters is not None and any(a is not None for a in adapters):
            raise InputError("adapters were given for a residual compiled without adapter slots: compile with "
                             "max_adapters to serve them, or pass adapters=None")
        return np.asarray(self.module(*inputs))

    def generate(self, prompts, adapters=None, max_new_tokens: int = 16, eos_token_id=None, ignore_eos: bool = False,
                 temperature: float = 0.0, seed: int | None = None) -> list:
        """Each prompt's generated token ids (prompts: sequences of token ids), up to max_new_tokens,
        ending at an end-of-sequence token (`eos_token_id`, an id or a list; default the model's)
        unless `ignore_eos`. Greedy at temperature 0, else sampled from softmax(logits / temperature)
        (`seed` fixes the draws); `adapters`: each prompt's adapter (None: the base model)."""
        ends = set() if ignore_eos else set(self.module.generation["eos"] if eos_token_id is None else
                                            np.asarray(eos_token_id).reshape(-1).tolist())
        try:
            prompts = [[int(t) for t in np.asarray(p).reshape(-1)] for p in prompts]
        except (TypeError, ValueError, OverflowError):
            raise InputError("prompts are sequences of integer token ids: pass e.g. [[1, 5, 9], [7]]") from None
        adapters = list(adapters) if adapters is not None else [None] * len(prompts)
        if len(adapters) != len(prompts):
            raise InputError(f"{len(adapters)} adapters for {len(prompts)} prompts: pass one per prompt (None: the base model)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens is {max_new_tokens!r}: pass a positive int")
        if temperature < 0:
            raise InputError(f"temperature is {temperature}: pass 0 (greedy) or more")
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise InputError(f"prompt {i} is empty: pass at least one token id")
            if len(prompt) + max_new_tokens > self.max_seq:
                raise InputError(f"prompt {i} has {len(prompt)} tokens, and {max_new_tokens} more do not fit the "
                                 f"cache's {self.max_seq} positions: shorten it, or compile with a larger max_seq")
        rng = np.random.default_rng(seed)
        outputs = [[] for _ in prompts]
        waiting, running, free = list(range(len(prompts))), {}, list(range(self.sequences))[::-1]

        def pick(logits) -> int:
            if temperature == 0:
                return int(np.argmax(logits))
            scaled = logits.astype(np.float64) / temperature
            weights = np.exp(scaled - scaled.max())
            return int(rng.choice(len(weights), p=weights / weights.sum()))

        def done(i) -> bool:
            return len(outputs[i]) == max_new_tokens or outputs[i][-1] in ends

        while waiting or running:
            while waiting and free:  # a waiting prompt takes a free slot: its prefill
                i, slot = waiting.pop(0), free.pop()
                logits = self.step([prompts[i]], [slot], [0], [adapters[i]])
                outputs[i].append(pick(logits[0, -1]))
                if done(i):
                    free.append(slot)
                else:
                    running[i] = slot
            if not running:
                continue
            rows = list(running)
            logits = self.step([[outputs[i][-1]] for i in rows], [running[i] for i in rows],
                               [len(prompts[i]) + len(outputs[i]) - 1 for i in rows], [adapters[i] for i in rows])
            for b, i in enumerate(rows):
                outputs[i].append(pick(logits[b, -1]))
                if done(i):
                    free.append(running.pop(i))
        return outputs
