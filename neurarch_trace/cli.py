"""The ``neurarch-trace`` command line: a thin front end over the tracer, the plan client and the
reference plan service.

    neurarch-trace TARGET --input DIMS[:dtype] [...]   trace a model into a .neurarch.json graph
    neurarch-trace plan FILE.neurarch.json [...]        plan a saved graph
    neurarch-trace serve [...]                          run the reference plan service

Every failure a user can cause prints one line ``neurarch-trace: ...`` on stderr and exits 1 (a
traceback only with ``--verbose``).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, NoReturn, Sequence

from neurarch_trace._version import __version__
from neurarch_trace.errors import NeurarchError

PROG = "neurarch-trace"


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line and exit code 1."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{PROG}: {message} (see {PROG} --help)\n")


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=(
            "Trace one forward pass of a PyTorch model into a .neurarch.json graph. "
            "Other commands: 'neurarch-trace plan FILE.neurarch.json' plans a saved graph; "
            "'neurarch-trace serve' runs the reference plan service."
        ),
        epilog=(
            "Targets: path/to/file.py:Attr, package.module:attr, hf:<repo-id or folder>. "
            "Attr may be an nn.Module instance, a Module class (built with no arguments) or a factory. "
            "Nothing leaves this machine unless --plan or --share is given."
        ),
    )
    parser.add_argument("target", help="path/to/file.py:Attr, package.module:attr or hf:<repo-id or local folder>")
    parser.add_argument(
        "--input", "-i", action="append", default=[], metavar="[NAME=]DIMS[:dtype]",
        help="one per forward argument, batch first, e.g. 1,3,224,224 or 1,16:long or attention_mask=1,16:long "
             "(NAME= passes it as a keyword argument); hf: targets default to 1,16",
    )
    parser.add_argument("--dtype", default=None, help="dtype of inputs without a suffix (default float32; long for hf:)")
    parser.add_argument("-o", "--output", default=None, metavar="PATH",
                        help="where to write the graph (default ./<name>.neurarch.json); '-' writes to stdout")
    parser.add_argument("--name", default=None, help="the graph's name (default: the attribute, or the repo name for hf:)")
    parser.add_argument("--depth", type=int, default=None, metavar="N",
                        help="stop descending at depth N (1 = the model's children); a container cut off there is one node")
    parser.add_argument("--device", choices=("cpu", "meta"), default=None,
                        help="trace on the CPU (default) or on PyTorch's meta device: shapes, parameters and FLOPs "
                             "without allocating weights or activations (default for hf: targets)")
    parser.add_argument("--weights", action="store_true",
                        help="hf: only: load the checkpoint's real weights instead of building from config.json alone")
    parser.add_argument("--hf-class", default="AutoModel", metavar="CLASS",
                        help="hf: only: the transformers class that builds the model (default AutoModel, the bare "
                             "model without a task head; e.g. AutoModelForCausalLM adds the LM head)")
    parser.add_argument("--verbose", action="store_true", help="print the full traceback on failure")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    plan_cli = _plan_cli()
    if plan_cli is not None:
        plan_cli.add_plan_arguments(parser)
    return parser


def _plan_cli() -> Any:
    try:
        from neurarch_trace import plan_cli
    except ImportError:  # pragma: no cover - only while the plan client is not installed
        return None
    return plan_cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 success, 1 failure, 2 blocked plan)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "serve":
        from neurarch_trace.server.cli import serve_main

        return serve_main(args_list[1:])
    if args_list and args_list[0] == "plan":
        plan_cli = _plan_cli()
        if plan_cli is None:  # pragma: no cover
            _say("the plan command is not available in this install")
            return 1
        return plan_cli.plan_main(args_list[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, --version, or a usage error already printed as one line
        return int(exc.code or 0)
    try:
        return _trace_command(args)
    except NeurarchError as exc:
        if args.verbose:
            traceback.print_exc()
        _say(str(exc))
        return 1
    except KeyboardInterrupt:
        _say("interrupted; nothing was written")
        return 1
    except Exception as exc:  # noqa: BLE001 - a fault of ours: one line, traceback with --verbose
        if args.verbose:
            traceback.print_exc()
        _say(f"internal error: {type(exc).__name__}: {exc} (run again with --verbose and report it)")
        return 1


def _trace_command(args: argparse.Namespace) -> int:
    from neurarch_trace.errors import TargetError
    from neurarch_trace.inputs import parse_dtype, parse_input
    from neurarch_trace.progress import Progress
    from neurarch_trace.targets import check_target_form

    check_target_form(args.target)
    is_hf = args.target.startswith("hf:")
    to_stdout = args.output == "-"
    plan_cli = _plan_cli()
    base = plan_cli.check_plan_arguments(args) if plan_cli is not None else None
    if args.depth is not None and args.depth < 0:
        raise TargetError(f"--depth must be 0 or more, not {args.depth}")
    if args.weights and not is_hf:
        raise TargetError("--weights applies to hf: targets only")
    if args.hf_class != "AutoModel" and not is_hf:
        raise TargetError("--hf-class applies to hf: targets only")
    input_texts = args.input or ([ "1,16"] if is_hf else [])
    if not input_texts:
        raise NeurarchError("no --input given: pass one per forward argument, batch first, e.g. --input 1,3,224,224")
    specs = [parse_input(text) for text in input_texts]
    default_dtype = parse_dtype(args.dtype) if args.dtype else None
    if default_dtype is None:
        import torch

        default_dtype = torch.long if is_hf else torch.float32
    device = args.device or ("meta" if is_hf and not args.weights else "cpu")
    if args.weights and device == "meta":
        raise TargetError("--weights loads real weights, which the meta device cannot hold: drop --device meta")
    out_path = None
    if not to_stdout and args.output is not None:
        out_path = args.output
        folder = os.path.dirname(os.path.abspath(out_path))
        if not os.path.isdir(folder):
            raise NeurarchError(f"cannot write {out_path}: folder {folder} does not exist")
        if os.path.isdir(out_path):
            raise NeurarchError(f"cannot write {out_path}: it is a folder; give a file name ending in .neurarch.json")

    progress = Progress()
    from neurarch_trace.api import trace_target

    with progress:
        graph, loaded_name = trace_target(
            args.target,
            specs,
            default_dtype=default_dtype,
            name=args.name,
            depth=args.depth,
            device=device,
            weights=args.weights,
            hf_class=args.hf_class,
            quiet=not args.verbose,
            progress=progress,
        )
    layers = sum(1 for c in graph["components"] if c["type"] not in ("input", "output"))
    training = graph.get("measured", {}).get("training")
    if isinstance(training, dict) and training.get("error"):  # the trace stands; the plan estimates memory
        _say(f"training step not rehearsed, memory will be estimated from layer outputs: {training['error']}")
    from neurarch_trace.graph import dumps_graph, write_graph

    if to_stdout:
        sys.stdout.write(dumps_graph(graph))
        sys.stdout.flush()
        path = None
    else:
        path = out_path or f"{_file_stem(graph['name'])}.neurarch.json"
        progress.step("writing the graph")
        try:
            write_graph(graph, path)
        except OSError as exc:
            raise NeurarchError(exc.strerror if exc.strerror and str(path) in exc.strerror else f"cannot write {path}: {exc}") from exc
        progress.clear()
        print(f"wrote {path} ({layers} layers, {len(graph['connections'])} connections)", file=sys.stderr, flush=True)
    if plan_cli is not None and (getattr(args, "plan", False) or getattr(args, "share", False)):
        return plan_cli.run_plan(args, graph, path, target=args.target, inputs=input_texts, base=base)
    return 0


def _file_stem(name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("._")
    return safe or "model"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
