"""Chapter 6: the audited functions run in a child process, so none can fake or stall a verdict.

A `Sandbox` forks one process (the fork start method: any callable works, closures included)
that holds the functions and runs them on request; the audit's own work (drawing the inputs,
testing the outputs) stays in the parent. A function that hangs, exits (`sys.exit`,
`os._exit`), is killed or runs out of memory fails the call with a `Fault` that says exactly
what happened; the next call starts a fresh process. Every call shares one time limit: the
seconds the functions may take in all, over the whole audit.

Large arrays travel through anonymous shared memory (`os.memfd_create`, Linux; pickled through
the pipe elsewhere): a read-only array (a scenario's batch, handed over slice by slice) is
copied once and then shared, and arrives read-only (numpy refuses a write into it; a library
that writes through its raw pointer is killed by SIGSEGV, and the finding says so); a writable
one is copied for each call and arrives writable. A numpy Generator argument travels by value
and its state comes back, so the parent's stream advances exactly as in one process, and the
results are those of one process. The child's private writable memory is capped (Linux:
RLIMIT_DATA; elsewhere the address space, RLIMIT_AS) at the machine's physical memory beyond
what it holds at the fork, so a verifier that asks for more gets a MemoryError, not the kernel's
out-of-memory killer (whose SIGKILL is reported as such if it comes anyway). Address space only
reserved (CUDA's, or weights mapped from a file) does not count, as it would under RLIMIT_AS.

The child runs on `threads` threads (1 by default): before the functions are loaded it sets the
thread counts of OpenMP and the BLAS libraries in its environment (THREAD_VARIABLES), and after,
torch's intra-op and inter-op threads in any torch module loaded. One sequence at a time gains
nothing from more threads on a shared machine: they only fight each other and the parent.
Warnings the functions issue are recorded in the child and counted apart from any verdict.
Needs the fork start method: Linux or macOS.
"""

import builtins
import mmap
import multiprocessing
import os
import resource
import signal
import sys
import time
import types
import warnings
from collections import Counter
from multiprocessing.reduction import recv_handle, send_handle

import numpy as np

AUDIT_TIMEOUT = 3600.0  # seconds the audited functions may take in all, over one audit
SHARE_BYTES = 1 << 20  # arrays of at least this size go through shared memory
SHARED_MAX = 1 << 31  # read-only arrays kept shared at once (oldest dropped first)
THREADS = 1  # threads of the child's OpenMP, BLAS and torch, unless asked otherwise
THREAD_VARIABLES = (  # read by OpenMP, OpenBLAS, MKL, Accelerate, BLIS and numexpr at their start
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def _physical_memory():
    """The machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


MEMORY_LIMIT = resource.RLIMIT_DATA if sys.platform.startswith("linux") else resource.RLIMIT_AS


def _mapped_now():
    """What MEMORY_LIMIT counts of this process now, in bytes: on Linux its data (private
    writable memory, statm's sixth field); elsewhere 0."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[5]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Fault(Exception):
    """The audited process failed to answer: it hung, exited, was killed or sent nonsense."""


class LoadFailed(Exception):
    """The functions could not be loaded in the child (an import that raised or exited)."""


def _signal_name(number):
    """'SIGKILL' for 9."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _death(exitcode, label, when="before answering"):
    """What an exit code says about how the child ended."""
    if exitcode is None:
        return f"{label}'s process stopped answering {when}"
    if exitcode < 0:
        name = _signal_name(-exitcode)
        note = {
            "SIGKILL": " (the kernel's out-of-memory killer sends it too)",
            "SIGSEGV": " (a segmentation fault: the function, or a library it calls, touched "
            "memory it may not; writing into a read-only input row through a raw pointer, as "
            "torch.from_numpy gives, does this: copy the rows first, or use an adapter, which "
            "hands torch private copies)",
        }.get(name, "")
        return f"{label}'s process was killed by {name}{note} {when}"
    return f"{label}'s process exited with code {exitcode} {when}"


def _base_exception(error):
    """A BaseException that is not an Exception, as a sentence: 'called sys.exit(0)'."""
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r})"
    return f"raised {type(error).__name__}{error.args!r}"


_REBUILT = {}


def _rebuilt(name, args):
    """An exception of the child's type name (a builtin where one exists) and arguments."""
    kind = getattr(builtins, name, None)
    if not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind = _REBUILT.setdefault(name, type(name, (Exception,), {"__module__": "verifier"}))
    try:
        return kind(*args)
    except Exception:  # a builtin that wants other arguments (UnicodeDecodeError, ...)
        return _REBUILT.setdefault(name, type(name, (Exception,), {}))(*args)


# ---- the child ---------------------------------------------------------------------------------


def _memory_cap():
    """The child's memory cap: the physical memory beyond what it holds at the fork."""
    return _physical_memory() + _mapped_now()


def _cap_memory():
    """Cap this process's memory (MEMORY_LIMIT) at _memory_cap()."""
    limit = _memory_cap()
    _, hard = resource.getrlimit(MEMORY_LIMIT)
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(MEMORY_LIMIT, (limit, hard))


def _code_of(fn):
    """The Python function behind fn: through an adapter's `engine_function`, partials, bound
    methods and callable objects (an nn.Module through its forward); None if there is none."""
    for _ in range(8):
        fn = getattr(fn, "engine_function", fn)  # the engine's function an adapter wraps
        fn = getattr(fn, "func", fn)  # functools.partial
        fn = getattr(fn, "__func__", fn)  # a bound method
        if isinstance(fn, types.FunctionType) and not hasattr(fn, "engine_function"):
            return fn
        if not callable(fn):
            break
        if not isinstance(fn, types.FunctionType):
            forward = getattr(type(fn), "forward", None)  # an nn.Module is called through forward
            fn = forward if forward is not None else type(fn).__call__
    return None


def _torch_of(fn):
    """The module bound to the name `torch` in the globals of fn's code, or None."""
    code = _code_of(fn)
    module = code.__globals__.get("torch") if code is not None else None
    return module if isinstance(module, types.ModuleType) else None


def _pin_environment(threads):
    """Set OpenMP's and the BLAS libraries' thread counts in this process's environment (read
    by libraries loaded from now on), and numpy's BLAS through threadpoolctl where installed."""
    if not threads:
        return
    os.environ.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # not needed by the audit: numpy's own loops use no BLAS threads
        return
    threadpool_limits(threads)


def _pin_torch(threads, functions):
    """Set torch's intra-op and inter-op threads in every torch module the functions use (and
    `torch` itself if loaded); a sentence saying what was set, or '' if no torch was loaded."""
    modules = {id(m): m for m in [sys.modules.get("torch")] + [_torch_of(f) for f in functions]}
    modules = [m for m in modules.values() if hasattr(m, "set_num_threads")]
    if not modules or not threads:
        return ""
    said = []
    for module in modules:
        module.set_num_threads(threads)
        try:
            module.set_num_interop_threads(threads)
            inter = f"{module.get_num_interop_threads()} inter-op"
        except (AttributeError, RuntimeError) as error:  # parallel work has already started
            inter = f"inter-op threads left as they were ({error})"
        said.append(f"{module.__name__} on {module.get_num_threads()} intra-op, {inter}")
    return "; ".join(said)


def _warned(caught):
    """Warnings recorded by catch_warnings, {'Category: message (file:line)': count}."""
    seen = Counter(
        f"{w.category.__name__}: {w.message} ({os.path.basename(w.filename)}:{w.lineno})"
        for w in caught
    )
    return dict(seen)


def _unpacked(conn, message, segments):
    """The call's arguments from their descriptions; arrays mapped from shared memory."""
    for dropped in message["drop"]:
        segments.pop(dropped, None)
    args, scratch = [], []
    for kind, *rest in message["args"]:
        if kind == "value":
            args.append(rest[0])
            continue
        if kind == "segment":
            key, size, offset, shape, strides, dtype = rest
            if key not in segments:
                fd = recv_handle(conn)
                segments[key] = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
                os.close(fd)
            args.append(np.ndarray(shape, dtype, segments[key], offset, strides))
            continue
        size, shape, dtype, writeable = rest
        fd = recv_handle(conn)
        access = mmap.ACCESS_COPY if writeable else mmap.ACCESS_READ
        scratch.append(mmap.mmap(fd, size, access=access))
        os.close(fd)
        args.append(np.ndarray(shape, dtype, scratch[-1]))
    return args


def _portable(result):
    """A pair of array-likes as numpy arrays where np.asarray reads them (torch tensors too)."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        return result
    parts = []
    for part in result:
        try:
            parts.append(np.asarray(part))
        except Exception:  # left as it is: the parent's check says what is wrong
            parts.append(part)
    return tuple(parts)


def _serve(conn, load, parent_end, threads=THREADS):
    """The child: load the functions, then run each request and send back what happened.

    parent_end, the parent's end of the pipe that the fork copied, is closed first: otherwise
    this process holds both ends, never sees the parent die, and outlives it, memory and all."""
    parent_end.close()
    _cap_memory()
    _pin_environment(threads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            functions = load()
            pinned = _pin_torch(threads, [f for f in functions.values() if f is not None])
        except Exception as error:
            conn.send(("load failed", f"raised {type(error).__name__}: {error}"))
            return
        except BaseException as error:  # sys.exit at import
            conn.send(("load failed", _base_exception(error)))
            return
    conn.send(("ready", pinned, _warned(caught)))
    segments = {}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        name, message = request
        args = _unpacked(conn, message, segments)
        clock, wall = time.thread_time(), time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                reply = ("ok", _portable(functions[name](*args)))
            except Exception as error:
                plain = all(isinstance(a, str | int | float | bool | None) for a in error.args)
                reply = ("raised", type(error).__name__, error.args if plain else (str(error),))
            except BaseException as error:  # SystemExit, KeyboardInterrupt: not an answer
                reply = ("base", _base_exception(error))
        cost = (time.thread_time() - clock, time.perf_counter() - wall)
        states = [a.bit_generator.state for a in args if isinstance(a, np.random.Generator)]
        del args
        try:
            conn.send((*reply, cost, states, _warned(caught)))
        except Exception as error:  # pickling failed before anything was written
            said = ("unsendable", type(reply[1]).__name__, str(error))
            conn.send((*said, cost, states, _warned(caught)))


# ---- the parent --------------------------------------------------------------------------------


def _owner(array):
    """The ndarray that owns the memory an array views."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _memfd(array):
    """A shared-memory file holding a C-contiguous copy of array; its descriptor."""
    fd = os.memfd_create("specdec-audit")
    os.ftruncate(fd, max(array.nbytes, 1))
    data, done = memoryview(np.ascontiguousarray(array)).cast("B"), 0
    while done < len(data):  # pwrite: one copy, faster than faulting in a fresh mapping
        done += os.pwrite(fd, data[done : done + (1 << 30)], done)
    return fd


class Sandbox:
    """Functions held by a forked child: call(name, *args) runs functions()[name] there.

    load() runs in the child and returns {name: callable}; timeout is the seconds all calls may
    take together (AUDIT_TIMEOUT by default); threads: the child's OpenMP, BLAS and torch
    threads (0 leaves them as the libraries set them). Use it as a context manager, or call
    close(). After start(), `pinned` says what torch threads were set, and `warnings` counts
    the warnings the functions issued, {text: count}.
    """

    def __init__(self, load, timeout=AUDIT_TIMEOUT, label="the audited code", threads=THREADS):
        self.load, self.timeout, self.label = load, float(timeout), label
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
            raise ValueError(f"threads must be an integer >= 0, got {threads!r}")
        self.threads, self.pinned, self.warnings = threads, "", Counter()
        self.cap = 0  # the child's memory cap, in bytes
        self.spent = 0.0  # wall seconds the child has taken, in calls and loads
        self.calls, self.cpu, self.inside = 0, 0.0, 0.0  # calls; their CPU and wall inside fn
        self.wall = 0.0  # wall seconds of call(), packing and unpacking included
        self.process = self.conn = None
        self.shared, self.drop, self.keys = {}, [], 0  # id(owner) -> (owner, key, fd, size)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "process", None) is not None and self.process.is_alive():
            self.process.kill()

    def function(self, name):
        """A callable that runs functions()[name] in the child."""
        return Remote(self, name)

    def start(self):
        """Fork the child and load its functions; LoadFailed if the load raised or exited."""
        if self.process is not None:
            return
        self._check_time()
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.cap = _memory_cap()
        self.process = context.Process(
            target=_serve,
            args=(child, self.load, self.conn, self.threads),
            name="audited",
            daemon=True,
        )
        self.process.start()
        child.close()
        try:
            answer = self._receive(self.label, "while loading")
        except Fault as fault:
            raise LoadFailed(str(fault)) from None
        if answer[0] != "ready":
            self._stop()
            raise LoadFailed(answer[1])
        self.pinned = answer[1]
        self.warnings.update(answer[2])

    def call(self, name, *args):
        """Run functions()[name](*args) in the child; its result, or the exception it raised."""
        self.start()
        began = time.perf_counter()
        message, fds = self._packed(args)
        try:
            self.conn.send((name, message))
            for fd in fds:
                send_handle(self.conn, fd, self.process.pid)
        except OSError:  # the child died since its last answer
            pass
        finally:
            for fd in fds:
                if fd not in (entry[2] for entry in self.shared.values()):
                    os.close(fd)
        label = f"the {name}"
        kind, *rest, cost, states, warned = self._receive(label)
        self.warnings.update(warned)
        self.calls, self.wall = self.calls + 1, self.wall + time.perf_counter() - began
        self.cpu, self.inside = self.cpu + cost[0], self.inside + cost[1]
        for arg, state in zip((a for a in args if isinstance(a, np.random.Generator)), states):
            arg.bit_generator.state = state
        if kind == "ok":
            return rest[0]
        if kind == "raised":
            error, error_args = rest
            if error == "MemoryError":
                error_args = (
                    f"{error_args[0] if error_args else ''} (its process may allocate "
                    f"{self.cap / 2**30:.1f} GiB)",
                )
            raise _rebuilt(error, error_args)
        if kind == "base":
            raise Fault(f"{label} {rest[0]}, which would have ended the audit")
        raise Fault(f"{label} returned a {rest[0]}, which cannot be sent back ({rest[1]})")

    def close(self):
        """Stop the child and free the shared memory."""
        if self.process is not None:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(timeout=5)
            self._stop()
        for _, _, fd, _ in self.shared.values():
            os.close(fd)
        self.shared.clear()

    # ---- internals

    def _check_time(self):
        """Fault if the time limit is spent."""
        if self.spent >= self.timeout:
            raise Fault(f"not run: the time limit of {self.timeout:g} s was spent by earlier calls")

    def _stop(self):
        """Kill the child if it still runs, and forget it (the next call starts a fresh one)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.process.close()
        self.conn.close()
        self.process = self.conn = None
        self.drop = []
        for _, _, fd, _ in self.shared.values():
            os.close(fd)
        self.shared.clear()  # a fresh child maps nothing yet

    def _receive(self, label, when="before answering"):
        """The child's next message, within the time left; Fault if it hangs or dies."""
        self._check_time()
        start, left = time.perf_counter(), self.timeout - self.spent
        ready = self.conn.poll(None if left == float("inf") else left)
        self.spent += time.perf_counter() - start
        if not ready:
            self._stop()
            limit = f"{self.timeout:g} s"
            raise Fault(f"timed out: {label} took the audit's whole time limit ({limit})")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            code = self.process.exitcode
            self._stop()
            raise Fault(_death(code, label, when)) from None
        except Exception as error:  # the message arrived whole but cannot be unpickled here
            raise Fault(f"{label} returned an object the audit cannot read: {error}") from None

    def _packed(self, args):
        """Descriptions of the arguments, and the descriptors of new shared memory to send."""
        described, fds = [], []
        for arg in args:
            small = not isinstance(arg, np.ndarray) or arg.nbytes < SHARE_BYTES
            if small or arg.dtype.hasobject or not hasattr(os, "memfd_create"):  # pickled
                described.append(("value", arg))
                continue
            owner = _owner(arg)
            offset = arg.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
            if owner.flags.writeable or not owner.flags.c_contiguous or offset < 0:
                described.append(("scratch", max(arg.nbytes, 1), arg.shape, arg.dtype.str))
                described[-1] += (arg.flags.writeable,)
                fds.append(_memfd(arg))
                continue
            if id(owner) not in self.shared:
                self._share(owner)
                fds.append(self.shared[id(owner)][2])
            _, key, _, size = self.shared[id(owner)]
            described.append(("segment", key, size, offset, arg.shape, arg.strides, arg.dtype.str))
        message = {"args": described, "drop": self.drop}
        self.drop = []
        return message, fds

    def _share(self, owner):
        """Copy a read-only array into shared memory once; drop the oldest beyond SHARED_MAX."""
        while self.shared and sum(e[3] for e in self.shared.values()) + owner.nbytes > SHARED_MAX:
            _, key, fd, _ = self.shared.pop(next(iter(self.shared)))
            os.close(fd)
            self.drop.append(key)
        self.keys += 1
        self.shared[id(owner)] = (owner, self.keys, _memfd(owner), max(owner.nbytes, 1))


class Remote:
    """A function held by a Sandbox's child, called like the function itself."""

    def __init__(self, sandbox, name):
        self.sandbox, self.name = sandbox, name
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args):
        """sandbox.call(name, *args)."""
        return self.sandbox.call(self.name, *args)
