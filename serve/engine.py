"""The server's engine: a Generator's Batcher driven by a thread of its own.

Everything that touches the batch or the module runs on the engine thread:
requests, aborts and adapter loads arrive as commands (from the HTTP event
loop or any thread), and the thread runs them between steps, then one step
while any sequence waits or runs, then calls every touched sequence's listener
(listeners hand their update to another thread and return). Callers never wait
for a step to end, so the event loop keeps taking requests and sending tokens
while the model runs.
"""

import collections
import threading
import time
from concurrent.futures import Future

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
        self._commands = collections.deque()  # (function, Future), run on the engine thread
        self._wake = threading.Condition()
        self._stopping = False
        self._now = self._describe()
        self._thread = threading.Thread(target=self._run, name="stageml-engine", daemon=True)

    def start(self) -> "Engine":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the engine thread after its current step; commands not yet run are cancelled."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()
        for _, future in self._commands:
            future.cancel()

    @property
    def tenants(self) -> bool:
        """Whether the module serves adapters (compiled with max_adapters)."""
        return self._batcher.max_adapters > 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(self, sequence: Sequence, listener, label: str = "the prompt") -> None:
        """Queues `sequence` (raises InputError, naming `label`, if its prompt or limits do not fit);
        `listener(sequence)` is called after each step it takes part in. A sequence whose adapter
        is not loaded when the engine takes it ends "error" at once (its listener is told)."""
        self.generator.check(sequence, label)
        self._command(lambda: self._add(sequence, listener, label))

    def abort(self, sequence: Sequence) -> Future:
        """Ends `sequence` at the next step and frees its cache slot: a Future of whether it was
        still running or waiting then."""
        def abort():
            return self._listeners.pop(sequence, None) is not None and self._batcher.abort(sequence)
        return self._command(abort)

    def load_adapter(self, name: str, source, exist_ok: bool = False) -> bool:
        """Registers adapter `name` from a PEFT directory once the engine gets to it (AdapterError if
        it does not load, or if the name is taken, unless `exist_ok`); whether it loaded it now."""
        def load():
            if name in self.generator.adapters:
                if exist_ok:
                    return False
                raise AdapterError(f"adapter {name!r} is already loaded: unload it first, or pick another name")
            self.generator.load_adapter(name, source)
            return True
        return self._command(load).result()

    def unload_adapter(self, name: str) -> None:
        """Forgets adapter `name` (AdapterError if unknown; AdapterInUse while requests use it)."""
        def unload():
            users = sum(s.adapter == name for s in (*self._batcher.waiting, *self._batcher.running))
            if users:
                raise AdapterInUse(f"adapter {name!r} is in use by {users} request(s): unload it once they finish")
            self.generator.unload_adapter(name)
        self._command(unload).result()

    def snapshot(self) -> dict:
        """The batch as of the last step: sequences running and waiting, and the adapters each group uses."""
        return self._now

    def _command(self, function) -> Future:
        future = Future()
        with self._wake:
            if self._stopping:
                future.set_exception(AdapterError("the server is shutting down: retry elsewhere"))
                return future
            self._commands.append((function, future))
            self._wake.notify()
        return future

    def _add(self, sequence: Sequence, listener, label: str) -> None:
        try:
            self._batcher.add(sequence, label)
        except Exception as e:  # its adapter is not loaded
            sequence.finish, sequence.error = "error", e
            listener(sequence)
            return
        self._listeners[sequence] = listener

    def _describe(self) -> dict:
        running, waiting = self._batcher.running, self._batcher.waiting
        return {"running": len(running), "waiting": len(waiting),
                "running_adapters": sorted({s.adapter for s in running} - {None}),
                "waiting_adapters": sorted({s.adapter for s in waiting} - {None}),
                "slots": self.generator.sequences, "max_adapters": self._batcher.max_adapters}

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._commands or self._batcher.busy or self._stopping):
                    self._wake.wait()
                if self._stopping:
                    return
                commands, self._commands = self._commands, collections.deque()
            for function, future in commands:
                try:
                    future.set_result(function())
                except Exception as e:
                    future.set_exception(e)
            if self._batcher.busy:
                self._step()
            self._now = self._describe()

    def _step(self) -> None:
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
