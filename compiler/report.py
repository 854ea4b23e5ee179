"""The compile report: what each stage got and what the compiler did."""

import collections
import dataclasses


@dataclasses.dataclass
class Report:
    ops: dict = dataclasses.field(default_factory=dict)        # binding time -> op count
    rewrites: dict = dataclasses.field(default_factory=dict)   # rewrite -> count
    lifted: dict = dataclasses.field(default_factory=dict)     # "static->dynamic" -> count
    folded_values: int = 0
    folded_bytes: int = 0
    custom_kernels: dict | None = None  # sm90: kernel -> dispatches using it
    iree_flags: list = dataclasses.field(default_factory=list)  # the residual's iree-compile flags

    @classmethod
    def from_stats(cls, ops: dict, stats: collections.Counter, kernels: bool = False) -> "Report":
        """`kernels`: the target has custom kernels, so the report counts their uses (maybe none)."""
        lifted = {k.split(" ", 1)[1]: v for k, v in stats.items() if k.startswith("lifted ")}
        stats = {k: v for k, v in stats.items() if v}
        used = {k: v for k, v in stats.items() if k.startswith("stageml_")}
        rewrites = {k: v for k, v in stats.items() if not k.startswith(("lifted ", "stageml_"))}
        return cls(ops=ops, rewrites=rewrites, lifted=lifted, custom_kernels=used if kernels else None)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = ["ops per binding time: " + ", ".join(f"{k} {v}" for k, v in self.ops.items()),
                 "rewrites: " + (", ".join(f"{k} x{v}" for k, v in sorted(self.rewrites.items())) or "none"),
                 "lifted values: " + (", ".join(f"{k} {v}" for k, v in self.lifted.items()) or "none"),
                 f"folded values: {self.folded_values} ({self.folded_bytes / 2**20:.2f} MiB)"]
        if self.iree_flags:
            lines.append("iree-compile flags: " + " ".join(self.iree_flags))
        if self.custom_kernels is not None:
            lines.append("custom kernels: " + (", ".join(f"{k} x{v}" for k, v in sorted(self.custom_kernels.items()))
                                               or "none"))
        return "\n".join(lines)
