"""The errors StageML raises for user mistakes.

Every user mistake (a bad model file, a bad stage spec, a wrong input, a
corrupt artifact) raises a subclass of `StageMLError` whose message is one
sentence naming the thing and the fix. Anything else is an internal bug.
"""


class StageMLError(Exception):
    """A user-facing error: the message names the thing and says what to do."""


class ModelLoadError(StageMLError):
    """The model file or object cannot be used as a model."""


class StageSpecError(StageMLError):
    """The stage spec is malformed or does not match the model."""


class CompileError(StageMLError):
    """A stage failed to lower or compile."""


class InputError(StageMLError):
    """A call's inputs do not match the compiled entry point."""


class ArtifactError(StageMLError):
    """A compiled artifact (.vmfb, .irpa, manifest) is missing or corrupt."""


class OutputError(StageMLError):
    """An output file or directory cannot be written."""


class AdapterError(StageMLError):
    """An adapter cannot be loaded or served (bad tensors, unknown name, no room)."""
