"""stageml-opt: run StageML passes on an MLIR file and print the result.

    stageml-opt in.mlir -p 'bt-annotate,bt-propagate,lora-sites{max-rank=8}' [--stage GLOB=TIME]...
    stageml-opt model.linalg.mlir -p use-parameters,resident-state,fuse-gathers
    stageml-opt in.mlir --verify-only      # parse and verify (bt dialect loaded)
    stageml-opt --list                     # every registered pass and its options

The input is parsed in the context its passes run in: torch-mlir's (with
the bt dialect) for the binding-time passes, IREE's for the residual's.
Output keeps locations out unless --debug-info.
"""

import argparse
import dataclasses
import os
import sys

from stageml.errors import StageMLError


def _list(passes) -> None:
    for name, pass_ in sorted(passes.items()):
        options = ", ".join(f"{f.name.replace('_', '-')}={f.default!r}" for f in dataclasses.fields(pass_.options))
        print(f"{name:22} [{pass_.context}] {pass_.description}" + (f"  {{{options}}}" if options else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="stageml-opt", description=__doc__.splitlines()[0])
    parser.add_argument("input", nargs="?", default="-", help="an MLIR file, or - for stdin (the default)")
    parser.add_argument("-p", "--passes", default="", help="a pipeline: comma-separated passes, name{opt=value,...}")
    parser.add_argument("--stage", action="append", default=[], metavar="GLOB=TIME",
                        help="for bt-annotate: the binding time of the arguments whose bt.name GLOB matches")
    parser.add_argument("--verify-only", action="store_true", help="parse and verify only")
    parser.add_argument("--debug-info", action="store_true", help="print locations")
    parser.add_argument("--list", action="store_true", help="list the registered passes")
    args = parser.parse_args(argv)

    from stageml.compiler import facts, stage_spec
    from stageml.compiler.ir import new_context
    from stageml.compiler.passes import PASSES, lookup, parse_pipeline, programs, run_passes
    from stageml.compiler.passes.bt_annotate import BtAnnotateOptions

    if args.list:
        _list(PASSES)
        return 0
    if args.input != "-" and not os.path.isfile(args.input):
        print(f"stageml-opt: error: input file {args.input!r} does not exist", file=sys.stderr)
        return 1
    try:
        pipeline = parse_pipeline(args.passes)
        contexts = {lookup(n).context for n, _ in pipeline} - {"any"}
        if "iree" in contexts:
            from iree.compiler import ir
            context = ir.Context()
        else:
            from torch_mlir import ir
            context = new_context()
        with context:
            try:
                # parseFile keeps the file name in locations (loc("in.mlir":3:8)).
                module = ir.Module.parse(sys.stdin.read()) if args.input == "-" else ir.Module.parseFile(args.input)
            except ir.MLIRError as e:
                print(f"stageml-opt: error: {e}", file=sys.stderr)
                return 1
            for index, (name, options) in enumerate(pipeline):  # (bt-annotate's stages come from --stage)
                if name == "bt-annotate" and not options.stages:  # the spec's defaults, then --stage
                    names = [facts.facts(f, "arg", i).get("name", f"arg{i}") for f in programs(module.operation)
                             for i in range(len(f.regions[0].blocks[0].arguments))]
                    stages = stage_spec.resolve(names, None, [stage_spec.parse_stage_option(s) for s in args.stage])
                    pipeline[index] = (name, BtAnnotateOptions(tuple(stages.items())))
            if not args.verify_only:
                run_passes(module, pipeline)
            print(module.operation.get_asm(enable_debug_info=args.debug_info))
    except StageMLError as e:
        print(f"stageml-opt: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
