"""stageml-opt: run StageML passes on an MLIR file and print the result.

    stageml-opt in.mlir -p bt-annotate,bt-propagate [--stage GLOB=TIME]...
    stageml-opt in.mlir --verify-only      # parse and verify (bt dialect loaded)
    stageml-opt residual.iree.mlir --pipeline sm90 [--no-custom-kernels]
                                           # the Hopper pipeline on IREE input
"""

import argparse
import os
import sys

from stageml.errors import StageMLError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="stageml-opt", description=__doc__.splitlines()[0])
    parser.add_argument("input", nargs="?", default="-", help="an MLIR file, or - for stdin (the default)")
    parser.add_argument("-p", "--passes", default="", help="comma-separated pass names, run in order")
    parser.add_argument("--stage", action="append", default=[], metavar="GLOB=TIME",
                        help="for bt-annotate: the binding time of the arguments whose bt.name GLOB matches")
    parser.add_argument("--no-lora-merge", action="store_true", help="bt-improve keeps adapter factors unmerged")
    parser.add_argument("--max-rank", type=int, default=16, help="for lora-sites: the rank factors are padded to")
    parser.add_argument("--list", action="store_true", help="list the registered passes")
    parser.add_argument("--pipeline", choices=["sm90"],
                        help="run a target pipeline on IREE input (the .iree.mlir stage) instead of passes")
    parser.add_argument("--no-custom-kernels", action="store_true", help="for --pipeline sm90: no hand-written kernels")
    args = parser.parse_args(argv)

    from torch_mlir import ir

    from stageml.compiler import stage_spec
    from stageml.compiler.ir import arg_name, new_context
    from stageml.compiler.passes import PASSES, PassOptions, main_func, run_passes

    if args.list:
        for name, (_, description) in sorted(PASSES.items()):
            print(f"{name:16} {description}")
        return 0
    if args.input != "-" and not os.path.isfile(args.input):
        print(f"stageml-opt: error: input file {args.input!r} does not exist", file=sys.stderr)
        return 1
    if args.pipeline:
        return _run_target_pipeline(args)
    context = new_context()
    try:
        with context:
            try:
                # parseFile keeps the file name in locations (loc("in.mlir":3:8)).
                module = ir.Module.parse(sys.stdin.read()) if args.input == "-" else ir.Module.parseFile(args.input)
            except ir.MLIRError as e:
                print(f"stageml-opt: error: {e}", file=sys.stderr)
                return 1
            names = [n for n in args.passes.split(",") if n]
            options = PassOptions(merge_lora=not args.no_lora_merge, max_rank=args.max_rank)
            if "bt-annotate" in names:
                func = main_func(module.operation)
                arg_names = [arg_name(func, i) for i in range(len(func.regions[0].blocks[0].arguments))]
                options.stages = stage_spec.resolve(arg_names, set(), [stage_spec.parse_stage_option(s) for s in args.stage])
            run_passes(module, names, options)
            print(module)
    except StageMLError as e:
        print(f"stageml-opt: error: {e}", file=sys.stderr)
        return 1
    return 0


def _run_target_pipeline(args) -> int:
    from iree.compiler import ir

    from stageml.compiler import sm90

    text = sys.stdin.read() if args.input == "-" else open(args.input).read()
    try:
        print(sm90.run_pipeline(text, custom_kernels=not args.no_custom_kernels)[0])
    except ir.MLIRError as e:
        print(f"stageml-opt: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
