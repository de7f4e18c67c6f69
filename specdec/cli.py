"""Chapter 6: the audit's command line, `python -m specdec_core audit path/to/file.py:function`.

The file is imported (its folder first on sys.path, as `python file.py` has it) only in the
child process that then runs the verifier (harness.Sandbox), so nothing it does at import or in
a call (raise, hang, `sys.exit`, `os._exit`, a signal) can end the audit without a verdict.
Exit codes: 0 passed, 1 failed, 2 a usage error or a file that cannot be loaded. The last line
printed is the verdict.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

from .adapters import ADAPTERS
from .audit import SUITES, audit_verifier
from .harness import AUDIT_TIMEOUT, LoadFailed, Sandbox


def _load(target):
    """The function named by 'path/to/file.py:function'; ValueError saying what is wrong."""
    path, _, name = target.rpartition(":")
    if not path or not name or not path.endswith(".py"):
        raise ValueError(f"need path/to/file.py:function, got {target!r}")
    if not Path(path).is_file():
        raise ValueError(f"no such file: {path}")
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:  # as `python file.py` does: the file imports its neighbours
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{path} has no function {name!r}")
    return fn


def _loader(target, adapter):
    """What the child runs first: import the file, take the function, wrap it in the adapter."""

    def load():
        fn = _load(target)
        return {"verifier": fn if adapter is None else ADAPTERS[adapter](fn)}

    return load


def _positive_seconds(text):
    """argparse type: a positive number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"need a number of seconds, got {text!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"need a positive, finite number of seconds, got {text}")
    return seconds


def _parser():
    """The command line's arguments."""
    parser = argparse.ArgumentParser(prog="python -m specdec_core")
    commands = parser.add_subparsers(dest="command", required=True)
    audit = commands.add_parser("audit", help="audit a verifier with verify()'s interface")
    audit.add_argument("target", help="path/to/file.py:function")
    audit.add_argument("--suite", choices=SUITES, default="small")
    audit.add_argument("--seed", type=int, default=0)
    audit.add_argument(
        "--adapter",
        choices=sorted(ADAPTERS),
        help="the function has an engine's shape: hf (_speculative_sampling), vllm-v0 "
        "(RejectionSampler.forward) or vllm-v1 (rejection_sample)",
    )
    audit.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=AUDIT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds the verifier may take in all (default {AUDIT_TIMEOUT:g})",
    )
    return parser


def main(argv=None):
    """Audit a verifier from the command line: exit 0 if it passes, 1 if it fails, 2 on misuse."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage and the error
        return int(exit_.code or 0)
    if args.seed < 0:
        print(f"error: --seed must be >= 0, got {args.seed}", file=sys.stderr)
        return 2
    try:
        with Sandbox(_loader(args.target, args.adapter), args.timeout, "the file") as sandbox:
            sandbox.start()  # the import runs here, in the child
            report = audit_verifier(sandbox.function("verifier"), args.suite, seed=args.seed)
    except LoadFailed as error:
        print(f"error: cannot load {args.target}: {error}", file=sys.stderr)
        return 2
    except BaseException as error:  # the audit itself stopped: never a silent exit
        print(f"error: the audit stopped: {type(error).__name__}: {error}", file=sys.stderr)
        return 130 if isinstance(error, KeyboardInterrupt) else 2
    print(report)
    return 0 if report.passed else 1
