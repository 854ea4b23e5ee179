"""The server's engine: a Generator's Batcher driven by a thread of its own.

Requests arrive from the HTTP event loop (`submit`, `abort`, adapter loads);
the engine thread runs one step at a time while any sequence waits or runs,
and after each step calls every touched sequence's listener (on the engine
thread, with the engine's lock held: listeners hand their update to another
thread and return). Adapter loads and unloads take the same lock, so they
fall between steps, never inside one.
"""

import threading
import time

from stageml.errors import AdapterError
from stageml.runtime.generation import Batcher, Sequence


class AdapterInUse(AdapterError):
    """An adapter cannot be unloaded while requests use it."""


class Engine:
    """Continuous batching of requests of any tenants on one Generator.

    `on_step(kind, rows, seconds)`, if set, is called after each model call
    ("prefill" or "decode", its rows, its wall time)."""

    def __init__(self, generator, on_step=None):
        self.generator = generator
        self.on_step = on_step
        self._batcher = Batcher(generator)
        self._listeners = {}
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="stageml-engine", daemon=True)

    def start(self) -> "Engine":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the engine thread after its current step; unfinished sequences end "abort"."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()
        for sequence in list(self._listeners):
            self.abort(sequence)

    @property
    def tenants(self) -> bool:
        """Whether the module serves adapters (compiled with max_adapters)."""
        return self._batcher.max_adapters > 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(self, sequence: Sequence, listener, label: str = "the prompt") -> None:
        """Queues `sequence` (raises InputError, naming `label`, if it cannot run);
        `listener(sequence)` is called after each step it takes part in."""
        with self._wake:
            self._batcher.add(sequence, label)
            self._listeners[sequence] = listener
            self._wake.notify()

    def abort(self, sequence: Sequence) -> bool:
        """Ends `sequence` now and frees its cache slot; whether it was still running or waiting."""
        with self._wake:
            self._listeners.pop(sequence, None)
            return self._batcher.abort(sequence)

    def load_adapter(self, name: str, source) -> None:
        """Registers adapter `name` from a PEFT directory (AdapterError if the name is taken or it does not load)."""
        with self._wake:
            if name in self.generator.adapters:
                raise AdapterError(f"adapter {name!r} is already loaded: unload it first, or pick another name")
            self.generator.load_adapter(name, source)

    def unload_adapter(self, name: str) -> None:
        """Forgets adapter `name` (AdapterError if unknown; AdapterInUse while requests use it)."""
        with self._wake:
            users = sum(s.adapter == name for s in (*self._batcher.waiting, *self._batcher.running))
            if users:
                raise AdapterInUse(f"adapter {name!r} is in use by {users} request(s): unload it once they finish")
            self.generator.unload_adapter(name)

    def snapshot(self) -> dict:
        """The batch now: sequences running and waiting, and the adapters each group uses."""
        with self._wake:
            running, waiting = self._batcher.running, self._batcher.waiting
            return {"running": len(running), "waiting": len(waiting),
                    "running_adapters": sorted({s.adapter for s in running} - {None}),
                    "waiting_adapters": sorted({s.adapter for s in waiting} - {None}),
                    "slots": self.generator.sequences, "max_adapters": self._batcher.max_adapters}

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._batcher.busy or self._stopping):
                    self._wake.wait()
                if self._stopping:
                    return
                started = time.perf_counter()
                touched = self._batcher.step()
                elapsed = time.perf_counter() - started
                if self.on_step is not None and self._batcher.last_call is not None:
                    self.on_step(*self._batcher.last_call, elapsed)
                for sequence in touched:
                    listener = (self._listeners.pop if sequence.finish else self._listeners.get)(sequence, None)
                    if listener is not None:
                        try:
                            listener(sequence)
                        except Exception:  # a listener whose request has gone: the sequence goes too
                            self._batcher.abort(sequence)
                            self._listeners.pop(sequence, None)
