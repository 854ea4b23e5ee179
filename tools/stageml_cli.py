"""stageml: serve a compiled residual.

    stageml serve out/llama.vmfb --adapter tenant-a=adapters/a [--adapter NAME=DIR]... [--host H] [--port P]
                  [--served-model-name NAME] [--tokenizer tokenizer.json] [--adapter-memory-budget BYTES]
                  [--policy auto|merged|factorized] [--log-level LEVEL]

Exit status: 0 a clean shutdown (Ctrl-C, SIGTERM); 1 a problem with the input
(module, adapters, address): one line `stageml: error: ...` naming it and the
fix; 2 a usage error; 3 an internal error (STAGEML_TRACEBACK=1 prints its traceback).
"""

import argparse
import os
import signal
import sys
import traceback

from stageml.errors import StageMLError
from stageml.tools import quiet_dependencies

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def _adapter(text: str) -> tuple:
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIR: pass e.g. tenant-a=adapters/a")
    return name, directory


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stageml", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a generation step (stagemlc --generate) over HTTP, "
                                              "OpenAI-compatible")
    serve.add_argument("module", help="the .vmfb stagemlc --generate wrote (its .irpa and .json beside it)")
    serve.add_argument("--adapter", action="append", default=[], type=_adapter, metavar="NAME=DIR",
                       help="load the PEFT adapter directory DIR as model NAME (repeat for more)")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="the port (default 8000; 0: any free one)")
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the base model's name in requests (default: the module file's stem)")
    serve.add_argument("--tokenizer", metavar="FILE", help="a tokenizer.json: text prompts and text in choices")
    serve.add_argument("--adapter-memory-budget", type=int, metavar="BYTES",
                       help="bytes the resident adapters may hold (default: no limit)")
    serve.add_argument("--policy", choices=("auto", "merged", "factorized"), default="auto",
                       help="how adapters are served (default auto: the cost policy picks per adapter)")
    serve.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                       help="uvicorn's log level (default warning)")
    return parser


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    quiet_dependencies()
    adapters = {}
    for name, directory in args.adapter:
        if name in adapters:
            print(f"stageml: error: adapter {name!r} is given twice: give each name once", file=sys.stderr)
            return EXIT_ERROR
        adapters[name] = directory
    serving = {} if args.adapter_memory_budget is None else {"adapter_memory_budget": args.adapter_memory_budget}
    if args.policy != "auto":
        serving["policy"] = args.policy
    from stageml.serve import serve
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a shutdown like Ctrl-C's, once uvicorn's is done
    try:
        serve(args.module, adapters, args.host, args.port, args.served_model_name, args.tokenizer, args.log_level,
              on_listen=lambda url: print(f"stageml serve: {args.module} on {url}", flush=True), **serving)
    except StageMLError as e:
        print("stageml: error: " + " ".join(str(e).split()), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as e:
        if os.environ.get("STAGEML_TRACEBACK"):
            traceback.print_exc()
        print(f"stageml: internal error: {type(e).__name__}: {' '.join(str(e).split())} (a bug in StageML; "
              "STAGEML_TRACEBACK=1 prints its traceback)", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
