"""The `bt` (binding-time) dialect, defined in IRDL in `bt.irdl.mlir`."""

from pathlib import Path

BT_IRDL = Path(__file__).with_name("bt.irdl.mlir")


def load_bt_dialect(context) -> None:
    """Loads the `bt` dialect into `context` (a torch_mlir.ir.Context)."""
    from torch_mlir import ir
    from torch_mlir.dialects import irdl

    with context, ir.Location.unknown():
        irdl.load_dialects(ir.Module.parse(BT_IRDL.read_text()))
