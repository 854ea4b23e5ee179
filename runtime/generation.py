"""Generation with a compiled step (compiler/generation.py) and the KV cache its module keeps.

    gen = stageml.load("out/llama.vmfb")               # compiled with generate=True
    out = gen.generate([[1, 5, 9], [7]], max_new_tokens=32)          # greedy
    out = gen.generate(prompts, adapters=["tenant-a", None], temperature=0.8, seed=0)

Each sequence holds one of the module's cache slots while it runs. A `Batcher`
does the scheduling, for `generate` and for the server alike: each `step`
admits waiting sequences into free slots and runs their prompts as one call
(prefill; the prompts right-padded to the longest, which is safe: a padding
token's key sits after its row's last position, hidden from that row's queries
until a later token overwrites it), then feeds every running sequence's last
token at its own position, all in one call (decode). A sequence leaves when it
has its tokens (or emits an end token), and a waiting one takes its slot at the
next step: continuous batching over the slots.
"""

import collections
import dataclasses

import numpy as np

from stageml.errors import InputError

PAD = 0  # the token that right-pads shorter prompts of one prefill call (any id in the vocabulary)


@dataclasses.dataclass(eq=False)
class Sequence:
    """One prompt's generation: `tokens` grows by one each step it takes part in, until
    `finish` says why it ended: "stop" (an end token), "length" (max_tokens), "abort",
    or "error" (its call failed: `error` holds the exception)."""
    prompt: list
    adapter: str | None = None
    max_tokens: int = 16
    temperature: float = 0.0
    ends: frozenset = frozenset()
    seed: int | None = None
    tokens: list = dataclasses.field(default_factory=list)
    slot: int | None = None
    finish: str | None = None
    error: Exception | None = None

    def __post_init__(self):
        self._rng = np.random.default_rng(self.seed)

    def take(self, logits) -> None:
        """Appends the next token: argmax at temperature 0, else drawn from softmax(logits / temperature)."""
        if self.temperature == 0:
            token = int(np.argmax(logits))
        else:
            scaled = logits.astype(np.float64) / self.temperature
            weights = np.exp(scaled - scaled.max())
            token = int(self._rng.choice(len(weights), p=weights / weights.sum()))
        self.tokens.append(token)
        if token in self.ends:
            self.finish = "stop"
        elif len(self.tokens) == self.max_tokens:
            self.finish = "length"


class Batcher:
    """Continuous batching of Sequences over a Generator's cache slots: `add` them, then call
    `step` while `busy`. Not thread-safe: one thread drives it (the server's engine, or generate)."""

    def __init__(self, generator: "Generator"):
        self.generator = generator
        self.waiting = collections.deque()
        self.running = []
        self.last_call = None  # ("prefill" or "decode", rows) of the latest step's call
        self._free = list(range(generator.sequences))[::-1]
        tenants = generator.module.tenants
        self.max_adapters = tenants["max_adapters"] if tenants is not None else 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, sequence: Sequence, label: str = "the prompt") -> None:
        """Queues `sequence` after checking it fits the module (raises InputError naming `label` if not)."""
        self.generator.check(sequence, label)
        self.generator.check_adapter(sequence)
        self.waiting.append(sequence)

    def abort(self, sequence: Sequence) -> bool:
        """Takes `sequence` out of the batch (its slot is free for the next step), ending it "abort";
        whether it had not ended."""
        if sequence.finish is not None:
            return False
        if sequence in self.waiting:
            self.waiting.remove(sequence)
        elif sequence in self.running:
            self._leave(sequence)
        sequence.finish = "abort"
        return True

    def step(self) -> list:
        """One call: the prefill of the waiting sequences that free slots (and the adapter slots)
        admit, if any, else a decode step of every running sequence. Returns the sequences that
        took a token or ended in it; the ended ones have left the batch."""
        self.last_call = None
        admitted = self._admit()
        if admitted:
            width = max(len(s.prompt) for s in admitted)
            rows = [s.prompt + [PAD] * (width - len(s.prompt)) for s in admitted]
            logits = self._call(admitted, rows, [0] * len(admitted))
            if logits is not None:
                for b, s in enumerate(admitted):
                    s.take(logits[b, len(s.prompt) - 1])
            touched, self.last_call = admitted, ("prefill", len(admitted))
        elif self.running:
            touched = list(self.running)
            logits = self._call(touched, [[s.tokens[-1]] for s in touched],
                                [len(s.prompt) + len(s.tokens) - 1 for s in touched])
            self.last_call = ("decode", len(touched))
            if logits is not None:
                for b, s in enumerate(touched):
                    s.take(logits[b, -1])
        else:
            return []
        for s in touched:
            if s.finish is not None:
                self._leave(s)
        return touched

    def _admit(self) -> list:
        """Waiting sequences, oldest first, for each free slot, until one whose adapter would take
        the running batch past the module's adapter slots: it waits for the running sequences of
        some adapter to end, and the ones behind it wait with it (first come, first served, so
        that no adapter starves while others keep the batch busy)."""
        adapters = {s.adapter for s in self.running} - {None}
        admitted = []
        for s in list(self.waiting):
            if not self._free:
                break
            if s.adapter is not None and s.adapter not in adapters:
                if len(adapters) == self.max_adapters:
                    break
                adapters.add(s.adapter)
            self.waiting.remove(s)
            s.slot = self._free.pop()
            self.running.append(s)
            admitted.append(s)
        return admitted

    def _call(self, sequences: list, tokens: list, positions: list):
        """The step's logits for `sequences`' rows, or None after ending them all "error"."""
        try:
            return self.generator.step(tokens, [s.slot for s in sequences], positions,
                                       [s.adapter for s in sequences] if self.max_adapters else None)
        except Exception as e:  # e.g. an adapter unloaded since: it ends these sequences, not the batcher
            for s in sequences:
                s.finish, s.error = "error", e
            return None

    def _leave(self, sequence: Sequence) -> None:
        self.running.remove(sequence)
        self._free.append(sequence.slot)
        sequence.slot = None


class Generator:
    """A loaded generation step: `generate`, `step` and, for a multi-tenant residual, its adapters
    (`load_adapter`, `unload_adapter`, `adapters`, `stats`, `plan`)."""

    def __init__(self, module):
        self.module = module
        config = module.generation
        self.sequences, self.max_seq = config["sequences"], config["max_seq"]
        names = [spec["name"] for spec in module.inputs]
        self._order = [names.index(config[role]) for role in ("tokens", "slots", "positions")]
        self._tenants = module.tenants is not None
        self.vocab_size = module.inputs[self._order[0]]["range"]["max"] + 1
        self.eos = list(config["eos"])
        self.cache_bytes = config.get("cache_bytes")  # its KV cache on the device

    def __getattr__(self, name):
        if name in ("load_adapter", "unload_adapter", "adapters", "stats", "plan") and self._tenants:
            return getattr(self.module, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def check(self, sequence: Sequence, label: str = "the prompt") -> None:
        """Raises InputError, naming `label`, unless `sequence`'s prompt and limits fit this module."""
        try:
            ids = np.asarray(sequence.prompt).reshape(-1)
        except ValueError:  # ragged
            ids = np.asarray([None])
        if ids.size and ids.dtype.kind not in "iu":
            raise InputError(f"{label} is not a sequence of integer token ids: pass e.g. [1, 5, 9]")
        sequence.prompt = ids.tolist()
        prompt, limit = sequence.prompt, sequence.max_tokens
        if not prompt:
            raise InputError(f"{label} is empty: pass at least one token id")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise InputError(f"{label} holds token id {min(prompt) if min(prompt) < 0 else max(prompt)}, outside "
                             f"0..{self.vocab_size - 1}: pass token ids below the vocabulary size")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InputError(f"max_new_tokens is {limit!r}: pass a positive int")
        if not np.isfinite(sequence.temperature) or sequence.temperature < 0:
            raise InputError(f"temperature is {sequence.temperature}: pass 0 (greedy) or more")
        if len(prompt) + limit > self.max_seq:
            raise InputError(f"{label} has {len(prompt)} tokens, and {limit} more do not fit the cache's "
                             f"{self.max_seq} positions: shorten it, or compile with a larger max_seq")

    def check_adapter(self, sequence: Sequence) -> None:
        """Raises InputError unless `sequence`'s adapter is loaded (or it has none)."""
        if sequence.adapter is not None:
            if not self._tenants:
                raise InputError("an adapter was given for a residual compiled without adapter slots: compile "
                                 "with max_adapters to serve adapters, or pass None (the base model)")
            if sequence.adapter not in self.module.adapters:
                raise InputError(f"unknown adapter {sequence.adapter!r}: load it with load_adapter first")

    def step(self, tokens, slots, positions, adapters=None) -> np.ndarray:
        """One call: row b's tokens [B, T] at positions[b].. of cache slot slots[b]; its logits [B, T, V].
        `adapters`: each row's adapter (a multi-tenant residual; None: the base model)."""
        try:
            tokens, slots, positions = (np.asarray(v, np.int64, order="C") for v in (tokens, slots, positions))
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
        (`seed` fixes each prompt's draws); `adapters`: each prompt's adapter (None: the base model)."""
        ends = frozenset() if ignore_eos else frozenset(
            self.eos if eos_token_id is None else np.asarray(eos_token_id).reshape(-1).tolist())
        prompts = list(prompts)
        adapters = list(adapters) if adapters is not None else [None] * len(prompts)
        if len(adapters) != len(prompts):
            raise InputError(f"{len(adapters)} adapters for {len(prompts)} prompts: pass one per prompt (None: the base model)")
        batcher = Batcher(self)
        sequences = [Sequence(p, a, max_new_tokens, temperature, ends, None if seed is None else (seed, i))
                     for i, (p, a) in enumerate(zip(prompts, adapters))]
        for i, sequence in enumerate(sequences):
            batcher.add(sequence, f"prompt {i}")
        while batcher.busy:
            for sequence in batcher.step():
                if sequence.error is not None:
                    raise sequence.error
        return [s.tokens for s in sequences]
