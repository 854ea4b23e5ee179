"""stagemlc: compile an exported PyTorch model into a staged residual.

    stagemlc model.pt2 -o out/residual.vmfb
    stagemlc out/dump/model.split.mlir -o out/residual.vmfb    # start at a dumped stage
    stagemlc models/llama -o out/llama.vmfb --generate [--max-seq N] [--sequences S] [--lora-config DIR]
             [--stage GLOB=TIME]... [--emit STAGE] [--dump-stages DIR] [--target cpu|cuda|sm90]
             [--cpu NAME] [--no-custom-kernels] [--no-lora-merge] [--keep-quantized] [--max-adapters N [--max-rank R]
             [--emit-plan plan.json|plan.mlir]] [--trust-model] [-q]

Exit status: 0 success; 1 a problem with the input (model file, stage spec,
options, output path): one line `stagemlc: error: ...` naming it and the fix;
2 a usage error (unknown or malformed arguments); 3 an internal error, a bug
in StageML: one line with the exception, and STAGEML_TRACEBACK=1 in the
environment prints its traceback.
"""

import argparse
import json
import os
import sys
import traceback

from stageml.compiler.options import EMITS, CompileOptions
from stageml.compiler.stage_spec import parse_stage_option
from stageml.compiler.targets import TARGETS
from stageml.errors import CompileError, OutputError, StageMLError
from stageml.tools import quiet_dependencies

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
TRACEBACK_ENV = "STAGEML_TRACEBACK"

EPILOG = ("exit status: 0 success; 1 an error in the input (one line 'stagemlc: error: ...'); "
          f"2 a usage error; 3 an internal error (a bug: rerun with {TRACEBACK_ENV}=1 to see its traceback)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stagemlc", description=__doc__.splitlines()[0], epilog=EPILOG)
    parser.add_argument("model", help="a .pt/.pt2 file written by torch.export.save, a stage file "
                                      "--dump-stages wrote (model.split.mlir, ...) to start there, or with "
                                      "--generate a transformers save_pretrained directory")
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
    parser.add_argument("--keep-quantized", action="store_true",
                        help="keep integer (torchao int8) weights integer in the residual, converted where used: "
                             "a quarter of the float32 bytes, slower calls on the CPU (see the README)")
    parser.add_argument("--max-adapters", type=int, metavar="N",
                        help="compile for multi-tenant serving: N adapter slots (needs a PEFT LoRA model)")
    parser.add_argument("--max-rank", type=int, metavar="R",
                        help="with --max-adapters: the highest LoRA rank an adapter may have (default 16)")
    parser.add_argument("--emit-plan", metavar="FILE",
                        help="with --max-adapters: also write the serving plan's MoE layers and their costs per "
                             "(tenant, expert), as JSON (.json) or plan-dialect MLIR (.mlir)")
    parser.add_argument("--generate", action="store_true",
                        help="compile one generation step of the causal LM over a KV cache the module keeps")
    parser.add_argument("--max-seq", type=int, default=2048, metavar="N", help="with --generate: positions per sequence")
    parser.add_argument("--sequences", type=int, default=8, metavar="S",
                        help="with --generate: the cache's sequence slots (sequences served at once)")
    parser.add_argument("--lora-config", metavar="DIR",
                        help="with a save_pretrained directory: a PEFT adapter directory whose adapter_config.json "
                             "names the LoRA sites (its weights, if there, are the default adapter)")
    parser.add_argument("--trust-model", action="store_true",
                        help="load a .pt2 even if that needs an unrestricted unpickle (it can run any code in the "
                             "file); only for files you trust")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no progress or report")
    return parser


def _same_file(a: str, b: str) -> bool:
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist (yet)
        return False


def _outputs(args) -> list:
    """The files the compile will write: -o, for a .vmfb its .irpa and .json, and the plan."""
    plan = [] if args.emit_plan is None else [args.emit_plan]
    if args.emit != "vmfb":
        return [args.output] + plan
    from stageml.runtime.manifest import artifact_files
    return list(artifact_files(args.output).values()) + plan


def _file_in_the_way(directory: str):
    """The nearest existing ancestor of `directory` (itself included) if it is not a directory."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def _check_outputs(args) -> None:
    """Refuses, before any work, outputs that would overwrite the input model,
    that are directories, or that lie below a file."""
    for path in _outputs(args):
        if _same_file(path, args.model):
            raise OutputError(f"output {path!r} would overwrite the input model {args.model!r}: "
                              "choose another -o")
        if os.path.isdir(path):
            raise OutputError(f"output {path!r} is a directory: pass a file path as -o")
    if args.emit_plan is not None:
        if args.max_adapters is None:
            raise OutputError("--emit-plan writes a multi-tenant residual's plan: add --max-adapters N")
        if args.emit != "vmfb":
            raise OutputError(f"--emit-plan reads the compiled residual, which --emit {args.emit} stops before: "
                              "drop --emit or --emit-plan")
        if os.path.splitext(args.emit_plan)[1] not in (".json", ".mlir"):
            raise OutputError(f"--emit-plan {args.emit_plan!r} names no plan form: end it in .json or .mlir")
        if len(set(map(os.path.abspath, _outputs(args)))) < len(_outputs(args)):
            raise OutputError(f"--emit-plan {args.emit_plan!r} is one of the residual's own files: choose another")
    blocked = _file_in_the_way(os.path.dirname(os.path.abspath(args.output)))
    if blocked is not None:
        raise OutputError(f"output {args.output!r} cannot be written: {blocked!r} is a file, not a directory; "
                          "choose another -o")
    if args.dump_stages is not None:
        blocked = _file_in_the_way(args.dump_stages)
        if blocked is not None:
            raise OutputError(f"--dump-stages {args.dump_stages!r} cannot be a directory: {blocked!r} is a file; "
                              "pass a directory (it is made if missing)")


def _options(args) -> CompileOptions:
    if args.max_rank is not None and args.max_rank < 1:
        raise CompileError(f"--max-rank {args.max_rank} is not a rank: pass a positive integer (default 16)")
    stages = [parse_stage_option(s) for s in args.stage]
    return CompileOptions(stages=tuple(stages), target=args.target, cpu=args.cpu, emit=args.emit,
                          dump_dir=args.dump_stages, merge_lora=not args.no_lora_merge, keep_quantized=args.keep_quantized,
                          max_adapters=args.max_adapters, max_rank=16 if args.max_rank is None else args.max_rank,
                          custom_kernels=not args.no_custom_kernels, trust_model=args.trust_model,
                          verbose=not args.quiet, generate=args.generate, max_seq=args.max_seq,
                          sequences=args.sequences, lora_config=args.lora_config)


def _write(args, art) -> str:
    """Writes the compile's output to -o (atomically: an unwritable path is an OutputError);
    returns the path of the main file."""
    from stageml.files import write_file
    if args.emit == "vmfb":
        path = art.save(args.output)
    else:
        write_file(args.output, art.mlir[args.emit])
        path = args.output
    if args.emit_plan is not None:
        form = os.path.splitext(args.emit_plan)[1][1:]
        plan = art.plan(form)
        write_file(args.emit_plan, plan if form == "mlir" else json.dumps(plan, indent=2) + "\n")
    return path


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _run(args) -> int:
    options = _options(args)
    _check_outputs(args)
    from stageml.compiler.driver import compile as compile_model
    art = compile_model(args.model, options=options)
    path = _write(args, art)
    if not args.quiet:
        if art.report is not None:
            print(art.report)
        print(f"wrote {path}")
    return EXIT_OK


def main(argv=None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (2), or --help (0)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.max_rank is not None and args.max_adapters is None:
        parser.print_usage(sys.stderr)
        print("stagemlc: error: --max-rank applies only with --max-adapters: add --max-adapters N or drop it",
              file=sys.stderr)
        return EXIT_USAGE
    quiet_dependencies()
    try:
        return _run(args)
    except StageMLError as e:
        print(f"stagemlc: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("stagemlc: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            traceback.print_exc()
        message = _one_line(e)
        print(f"stagemlc: internal error (a bug in StageML): {type(e).__name__}"
              f"{': ' + message if message else ''}; rerun with {TRACEBACK_ENV}=1 to see the traceback, "
              "and report it", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
