"""make engines: audit released engines' own code, each in its venv, and write the record.

Venvs live in .venv-engines (git-ignored), never in the book's .venv:
- base: torch (requirements-engines/base.txt), numpy, scipy, pandas and this project (editable);
- transformers-<version>: one release of transformers and its dependencies, pinned in
  requirements-engines/transformers-<version>.txt. It reaches base's packages (torch included)
  through a .pth file, so torch is installed once.
vLLM 0.6.3 is not installed (its dependencies pull a CUDA torch): the two files its V0 sampler
needs are taken out of the released wheel, checked against the wheel's RECORD, unmodified.

Each target runs in a fresh process, `python -m specdec.engines NAME`, with one thread for
torch and the BLAS. One line per target as it ends; the record goes to specdec/data/engines.json.
Standard library only: this script runs with the machine's python3.

    python3 scripts/engines.py [NAME ...]   # all targets, or those named
"""

import base64
import csv
import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from specdec.engines import RECORD, TARGETS, VLLM_FILES, check_record  # noqa: E402

VENVS = ROOT / ".venv-engines"
PINS = ROOT / "requirements-engines"
VLLM_WHEEL = "vllm==0.6.3"
VLLM_SOURCE = VENVS / "vllm-0.6.3"
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
TTY = sys.stdout.isatty()


class Ticker:
    """A progress line while a step runs: elapsed seconds and the step's own progress, redrawn
    each second on a terminal, a line each minute in a log."""

    def __init__(self, label):
        self.label, self.status, self.began = label, "", time.perf_counter()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        if TTY:
            print("\r\033[K", end="", flush=True)

    def _tick(self):
        every = 1 if TTY else 60
        while not self.done.wait(every):
            line = f"  … {self.label}: {time.perf_counter() - self.began:.0f} s {self.status}"
            print(f"\r\033[K{line}" if TTY else line, end="" if TTY else "\n", flush=True)


def _run(command, label, env=None, log=None):
    """Run command under a Ticker; its stdout. Lines 'progress a/b' on stderr feed the ticker;
    the rest of stderr goes to log. RuntimeError with the last lines if it fails."""
    with Ticker(label) as ticker:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        output = []
        reader = threading.Thread(target=lambda: output.append(process.stdout.read()))
        reader.start()
        errors = []
        for line in process.stderr:
            if line.startswith("progress "):
                done, total = map(int, line.split()[1].split("/"))
                ticker.status = f"({100 * done / total:.0f} % of the suite's requests)"
            else:
                errors.append(line)
        process.wait()
        reader.join()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(errors))
    if process.returncode:
        tail = "".join(line for line in errors if "WARNING: Location" not in line)[-2000:]
        raise RuntimeError(f"{label} failed (exit {process.returncode}):\n{tail}")
    return output[0] if output else ""


def _pip(venv, *args, label):
    """pip install into venv, quietly, under a Ticker."""
    _run([str(venv / "bin" / "pip"), "install", "--quiet", "--progress-bar", "off", *args], label)


def base_venv():
    """.venv-engines/base with torch and the project; made once (stamp: its pins)."""
    venv, pins = VENVS / "base", PINS / "base.txt"
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text() == pins.read_text():
        return venv
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    _pip(venv, "-r", str(pins), label="installing torch and the audit's packages into base")
    _pip(venv, "--no-deps", "-e", str(ROOT), label="installing this project into base")
    stamp.write_text(pins.read_text())
    print(f"venv base: installed in {time.perf_counter() - began:.0f} s", flush=True)
    return venv


def _site_packages(venv):
    """venv's site-packages folder."""
    return next((venv / "lib").glob("python3*/site-packages"))


def release_venv(name):
    """.venv-engines/<name>: its pins installed over base's packages (a .pth reaches them)."""
    base = base_venv()
    if name == "base":
        return base
    venv, pins = VENVS / name, PINS / f"{name}.txt"
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text() == pins.read_text():
        return venv
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    link = f"import site; site.addsitedir({str(_site_packages(base))!r})\n"
    (_site_packages(venv) / "engines_base.pth").write_text(link)
    _pip(venv, "--no-deps", "-r", str(pins), label=f"installing {name}")
    stamp.write_text(pins.read_text())
    print(f"venv {name}: installed in {time.perf_counter() - began:.0f} s", flush=True)
    return venv


def _record_hashes(wheel):
    """{path: sha256 as in the wheel's RECORD (urlsafe base64, no padding)}."""
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    rows = csv.reader(io.StringIO(wheel.read(name).decode()))
    return {row[0]: row[1].removeprefix("sha256=") for row in rows if len(row) > 1 and row[1]}


def vllm_source():
    """The V0 sampler's files from vLLM 0.6.3's released wheel, unmodified (checked against the
    wheel's RECORD), in .venv-engines/vllm-0.6.3."""
    if all((VLLM_SOURCE / f).is_file() for f in VLLM_FILES):
        return VLLM_SOURCE
    downloads = VENVS / "downloads"
    if not list(downloads.glob("vllm-0.6.3-*.whl")):
        label = f"downloading {VLLM_WHEEL} (193.5 MB, no dependencies)"
        pip = str(base_venv() / "bin" / "pip")
        _run([pip, "download", "--quiet", "--no-deps", VLLM_WHEEL, "-d", str(downloads)], label)
    with zipfile.ZipFile(next(downloads.glob("vllm-0.6.3-*.whl"))) as wheel:
        hashes = _record_hashes(wheel)
        for relative in VLLM_FILES:
            data = wheel.read(relative)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            if digest.decode() != hashes[relative]:
                raise RuntimeError(f"{relative} differs from the wheel's RECORD")
            (VLLM_SOURCE / relative).parent.mkdir(parents=True, exist_ok=True)
            (VLLM_SOURCE / relative).write_bytes(data)
    print(f"vLLM 0.6.3: {len(VLLM_FILES)} files taken from the wheel, hashes checked", flush=True)
    return VLLM_SOURCE


def audit(t):
    """Run target t in its venv: its record entry (verdict NOT RUN, with why, if it broke)."""
    try:
        venv = release_venv(t.venv)
        extra = [str(vllm_source())] if t.package == "vllm" else []
        command = [str(venv / "bin" / "python"), "-m", "specdec.engines", t.name, *extra]
        env = os.environ | ONE_THREAD | {"PYTHONWARNINGS": "ignore"}
        slug = "".join(c if c.isalnum() else "-" for c in t.name.lower())
        log = VENVS / "logs" / f"{slug}.log"
        out = _run(command, f"auditing {t.name} ({t.suite} suite)", env, log)
        return json.loads(out.strip().splitlines()[-1])
    except RuntimeError as error:
        from specdec.engines import entry

        broken = entry(t, False, 0, 0, 0.0) | {"verdict": "NOT RUN"}
        return broken | {"note": str(error).strip().splitlines()[-1][:300]}


def line(item):
    """One target's line, as printed and in CONTRIBUTING."""
    counted = f"{item['failed']} of {item['statistics']} statistics failed"
    return (
        f"{item['name']}: {item['verdict']} ({counted}; {item['mode']}, {item['suite']} suite, "
        f"seed {item['seed']}) in {item['seconds']:.0f} s; expected {item['expected']}"
        + (f" [{item['note']}]" if item.get("note") else "")
    )


def main(names):
    """Audit the targets named (all by default), print a line each, write the record."""
    began = time.perf_counter()
    chosen = [t for t in TARGETS if not names or t.name in names]
    if names and len(chosen) != len(names):
        known = "; ".join(t.name for t in TARGETS)
        print(f"error: unknown target among {names}; targets: {known}", file=sys.stderr)
        return 2
    VENVS.mkdir(exist_ok=True)
    entries = []
    for t in chosen:
        entries.append(audit(t))
        print(line(entries[-1]), flush=True)
        for note in entries[-1].get("notes", []):  # what the run exercised (drafter mode)
            print(f"    {note}", flush=True)
    seconds = time.perf_counter() - began
    record = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "command": "make engines",
        "seconds": round(seconds, 1),
        "targets": entries,
    }
    if names and RECORD.exists():  # a partial run replaces its own targets only
        old = json.loads(RECORD.read_text())
        ran = {e["name"] for e in entries}
        order = [t.name for t in TARGETS]
        kept = [e for e in old["targets"] if e["name"] not in ran] + entries
        record["targets"] = sorted(kept, key=lambda e: order.index(e["name"]))
    RECORD.write_text(json.dumps(check_record(record), indent=1, ensure_ascii=False) + "\n")
    print(f"make engines: {len(entries)} targets in {seconds:.0f} s; record {RECORD.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
