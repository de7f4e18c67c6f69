"""Chapter 6: the audit's command line, `python -m specdec_core audit TARGET` or `specdec-audit
TARGET`, where TARGET is `package.module:function` (imported as `python -c "import ..."` would)
or `path/to/file.py:function` (a file of one's own; its folder first on sys.path, as
`python file.py` has it; a file inside a package is imported as that package's module).

The target is imported only in the child process that then runs the verifier (harness.Sandbox),
so nothing it does at import or in a call (raise, hang, `sys.exit`, `os._exit`, a signal) can end
the audit without a verdict. That child runs on one thread (OpenMP, the BLAS, torch's intra-op
and inter-op pools) unless --threads says otherwise. Exit codes: 0 passed, 1 failed, 2 a usage
error or a target that cannot be loaded (checked before any suite runs). The last line printed
is the verdict. This module and what it imports need numpy and scipy only.
"""

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path

from .adapters import ADAPTERS
from .audit import SUITES, audit_verifier
from .harness import AUDIT_TIMEOUT, THREAD_VARIABLES, THREADS, LoadFailed, Sandbox

CONSOLE = "specdec-audit"  # the console command pip installs (pyproject's [project.scripts])
VERIFY_PARAMETERS = ("target_probs", "draft_probs", "draft_tokens", "rng")


def _is_file(where):
    """Whether a target's part before the colon names a file rather than a module."""
    return where.endswith(".py") or os.sep in where or Path(where).is_file()


def _package_root(path):
    """(folder to put on sys.path, dotted module name) of a file inside a package, or None."""
    path = Path(path).resolve()
    if not (path.parent / "__init__.py").is_file():
        return None
    parts, folder = [path.stem], path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return str(folder), ".".join(parts)


def _module(where):
    """The module a target names: a dotted module path, or a file (see the module's docstring)."""
    if not _is_file(where):
        return importlib.import_module(where)
    if not where.endswith(".py") or not Path(where).is_file():
        raise ValueError(f"no such file: {where}")
    folder, name = _package_root(where) or (str(Path(where).resolve().parent), None)
    if folder not in sys.path:  # the file imports its neighbours, or its package's modules
        sys.path.insert(0, folder)
    if name is not None:  # relative imports work, as when the package is imported
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(Path(where).stem, where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(target):
    """The object named by 'package.module:name' or 'path/to/file.py:name' (name may be dotted,
    Class.method); ValueError saying what is wrong."""
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ValueError(
            f"need package.module:function or path/to/file.py:function, got {target!r}"
        )
    found = _module(where)
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ValueError(f"{where} has no {name!r}")
    if not callable(found):
        raise ValueError(f"{where}:{name} is a {type(found).__name__}, not a function")
    return found


def _check_verifier(fn, target):
    """TypeError unless fn can be called as fn(target_probs, draft_probs, draft_tokens, rng)."""
    try:
        inspect.signature(fn).bind(*VERIFY_PARAMETERS)
    except TypeError as error:
        raise TypeError(
            f"it cannot be called as fn({', '.join(VERIFY_PARAMETERS)}): {error}; an engine's "
            f"function needs --adapter ({', '.join(sorted(ADAPTERS))})"
        ) from None
    except ValueError:  # no signature to read (a builtin): the calls will tell
        pass


def _check_drafter(fn, target):
    """TypeError unless fn can be called as fn(draft_probs, rng)."""
    try:
        inspect.signature(fn).bind("draft_probs", "rng")
    except TypeError as error:
        raise TypeError(
            f"{target} cannot be called as drafter(draft_probs, rng): {error}"
        ) from None
    except ValueError:
        pass


def _loader(target, adapter, drafter=None):
    """What the child runs first: import the target, take the function, wrap it in the adapter
    (which checks its parameters by name); the same for the drafter."""

    def load():
        fn = _load(target)
        if adapter is None:
            _check_verifier(fn, target)
        functions = {"verifier": fn if adapter is None else ADAPTERS[adapter](fn)}
        if drafter is not None:
            functions["drafter"] = _load(drafter)
            _check_drafter(functions["drafter"], drafter)
        return functions

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


def _threads(text):
    """argparse type: a number of threads, 0 or more."""
    try:
        threads = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"need a whole number of threads, got {text!r}") from None
    if threads < 0:
        raise argparse.ArgumentTypeError(f"need 0 or more threads, got {threads}")
    return threads


def _add_arguments(audit):
    """The audit command's arguments."""
    audit.add_argument("target", help="package.module:function or path/to/file.py:function")
    audit.add_argument(
        "--suite",
        choices=SUITES,
        help="small (the default) or engine; drafter mode runs the engine suite",
    )
    audit.add_argument("--seed", type=int, default=0)
    audit.add_argument(
        "--adapter",
        choices=sorted(ADAPTERS),
        help="the function has an engine's shape: hf (_speculative_sampling), vllm-v0 "
        "(RejectionSampler.forward) or vllm-v1 (rejection_sample)",
    )
    audit.add_argument(
        "--drafter",
        metavar="TARGET",
        help="audit drafter(draft_probs, rng) -> drafts, or (drafts, q), with the verifier "
        "(drafter mode: drafts may stop early)",
    )
    audit.add_argument(
        "--threads",
        type=_threads,
        default=THREADS,
        metavar="N",
        help=f"threads of the verifier's process: OpenMP, BLAS, torch intra-op and inter-op "
        f"(default {THREADS}; 0 leaves them as the libraries set them)",
    )
    audit.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=AUDIT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds the verifier may take in all (default {AUDIT_TIMEOUT:g})",
    )
    audit.add_argument(
        "--verbose", action="store_true", help="print the warnings the verifier's code issued"
    )


def _parser(prog="python -m specdec_core"):
    """The command line's arguments: `audit TARGET ...`, or `TARGET ...` for the console
    command."""
    parser = argparse.ArgumentParser(prog=prog)
    if prog == CONSOLE:
        _add_arguments(parser)
        return parser
    commands = parser.add_subparsers(dest="command", required=True)
    _add_arguments(commands.add_parser("audit", help="audit a verifier with verify()'s interface"))
    return parser


def _header(args, sandbox):
    """The report's first lines: what is audited, and on how many threads."""
    mode = f"drafter {args.drafter} with verifier" if args.drafter else "verifier"
    adapter = f", adapter {args.adapter}" if args.adapter else ""
    lines = [f"Audit of {mode} {args.target}{adapter}: suite {args.suite}, seed {args.seed}"]
    if args.threads:
        torch = f"; {sandbox.pinned}" if sandbox.pinned else ""
        lines.append(
            f"Its process runs on {args.threads} thread{'s' * (args.threads != 1)} "
            f"({', '.join(THREAD_VARIABLES[:3])}, ...{torch}); --threads N to change"
        )
    else:
        lines.append("Its threads are left as its libraries set them (--threads 0)")
    return "\n".join(lines)


def main(argv=None, prog="python -m specdec_core"):
    """Audit a verifier from the command line: exit 0 if it passes, 1 if it fails, 2 on misuse."""
    try:
        args = _parser(prog).parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage and the error
        return int(exit_.code or 0)
    if args.seed < 0:
        print(f"error: --seed must be >= 0, got {args.seed}", file=sys.stderr)
        return 2
    if args.drafter and args.suite == "small":
        print("error: --drafter needs fixed rows: the engine suite (the default)", file=sys.stderr)
        return 2
    args.suite = args.suite or ("engine" if args.drafter else "small")
    load = _loader(args.target, args.adapter, args.drafter)
    try:
        with Sandbox(load, args.timeout, "the target", threads=args.threads) as sandbox:
            sandbox.start()  # the imports and the signature checks run here, in the child
            print(_header(args, sandbox), flush=True)
            drafter = sandbox.function("drafter") if args.drafter else None
            verifier = sandbox.function("verifier")
            report = audit_verifier(verifier, args.suite, seed=args.seed, drafter=drafter)
    except LoadFailed as error:
        print(f"error: cannot load {args.target}: {error}", file=sys.stderr)
        return 2
    except BaseException as error:  # the audit itself stopped: never a silent exit
        print(f"error: the audit stopped: {type(error).__name__}: {error}", file=sys.stderr)
        return 130 if isinstance(error, KeyboardInterrupt) else 2
    if args.verbose and report.warnings:
        print("Warnings from the verifier's code (count, text):")
        for text, count in sorted(report.warnings.items(), key=lambda item: -item[1]):
            print(f"  {count:>6,}  {text}")
    print(report)
    return 0 if report.passed else 1


def run():
    """`python -m specdec_core audit TARGET [options]`: main, then exit with its code."""
    sys.exit(main(sys.argv[1:]))


def console():
    """The `specdec-audit` command: `specdec-audit TARGET [options]`."""
    sys.exit(main(sys.argv[1:], prog=CONSOLE))
