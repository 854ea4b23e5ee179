"""stagemlc: compile an exported PyTorch model into a staged residual.

    stagemlc model.pt2 -o out/residual.vmfb
    stagemlc out/dump/model.split.mlir -o out/residual.vmfb    # start at a dumped stage [--stage GLOB=TIME]... [--emit STAGE]
             [--dump-stages DIR] [--target cpu|cuda|sm90] [--cpu NAME] [--no-custom-kernels] [--no-lora-merge]
             [--max-adapters N [--max-rank R]] [-q]
"""

import argparse
import os
import sys
import warnings

from stageml.compiler.options import EMITS, CompileOptions
from stageml.compiler.stage_spec import parse_stage_option
from stageml.compiler.targets import TARGETS
from stageml.errors import StageMLError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="stagemlc", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .pt/.pt2 file written by torch.export.save, or a stage file "
                                      "--dump-stages wrote (model.split.mlir, ...) to start there")
    parser.add_argument("-o", "--output", default="residual.vmfb", help="the residual .vmfb (.irpa and .json go beside it)")
    parser.add_argument("--stage", action="append", default=[], metavar="GLOB=TIME",
                        help="binding time (static|adapter|dynamic) of the parameters, buffers or inputs GLOB matches")
    parser.add_argument("--emit", choices=list(EMITS), default="vmfb", help="stop after this stage and write its output to -o")
    parser.add_argument("--dump-stages", metavar="DIR", help="write every stage's output into DIR")
    parser.add_argument("--target", choices=list(TARGETS), default="cpu",
                        help="cpu: the host CPU; cuda: IREE's CUDA backend (sm_80 PTX, JIT-compiled on newer GPUs); "
                             "sm90: Hopper, with StageML's hand-written kernels (building them needs nvcc)")
    parser.add_argument("--cpu", default="host", metavar="NAME",
                        help="--target cpu: the CPU to compile for (host, or an LLVM CPU name such as znver4)")
    parser.add_argument("--no-custom-kernels", action="store_true",
                        help="sm90: IREE codegen only, no hand-written kernels (and no nvcc)")
    parser.add_argument("--no-lora-merge", action="store_true", help="keep LoRA factors unmerged in the residual")
    parser.add_argument("--max-adapters", type=int, metavar="N",
                        help="compile for multi-tenant serving: N adapter slots (needs a PEFT LoRA model)")
    parser.add_argument("--max-rank", type=int, default=16, metavar="R",
                        help="with --max-adapters: the highest LoRA rank an adapter may have (default 16)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no progress or report")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # torch's and transformers' deprecation noise
    try:
        from stageml.compiler.driver import compile as compile_model
        stages = [parse_stage_option(s) for s in args.stage]
        options = CompileOptions(stages=tuple(stages), target=args.target, cpu=args.cpu, emit=args.emit,
                                 dump_dir=args.dump_stages, merge_lora=not args.no_lora_merge,
                                 max_adapters=args.max_adapters, max_rank=args.max_rank,
                                 custom_kernels=not args.no_custom_kernels, verbose=not args.quiet)
        art = compile_model(args.model, options=options)
        if args.emit == "vmfb":
            path = art.save(args.output)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            with open(args.output, "w") as f:
                f.write(art.mlir[args.emit])
            path = args.output
    except StageMLError as e:
        print(f"stagemlc: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        if art.report is not None:
            print(art.report)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
