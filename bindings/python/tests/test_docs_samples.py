"""The documentation site's code samples (docs/samples/, included into the
guides with pymdownx.snippets) are run here, and nothing in a guide escapes
that: every fenced block in a guide is one snippet include, every sample is
included, and a sample under docs/samples/notrun/ (what nothing here can run)
is said to be "not run" on the page that shows it. The samples under
docs/samples/launchers/ (Slurm, mpirun, several hosts, torchrun across hosts,
Ray, Kubernetes) are run by tests/launchers (make test-launchers), which
this checks by name.

- *.py: a 2-rank job (launch.run_ranks, with nexar run's and torchrun's
  variables);
- *.sh: bash -e in docs/samples (or the repository root when its first line
  says "# from the repository root"), with build/ (the nexar command) and the
  venv's bin first on PATH;
- *.c, *.cpp: compiled against include/nexar.h (and nexar.hpp) and run with 2
  ranks through tests/c/launch.sh.

Also: every NEXAR_* variable the code reads is on docs/reference/env.md and in
README's table."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from launch import run_ranks

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DOCS = os.path.join(ROOT, "docs")
SAMPLES = os.path.join(DOCS, "samples")
BUILD = os.path.join(ROOT, "build")
GUIDES = [os.path.join(DOCS, "index.md"), os.path.join(DOCS, "quickstart.md"),
          *sorted(glob.glob(os.path.join(DOCS, "guides", "*.md")))]
RUNNERS = (".py", ".sh", ".c", ".cpp")

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')


def _rel(p):
    return os.path.relpath(p, ROOT)


def _samples():
    out = []
    for dirpath, _, files in os.walk(SAMPLES):
        out += [os.path.relpath(os.path.join(dirpath, f), SAMPLES) for f in files]
    return sorted(out)


def _includes():
    """(page, sample, text of the page before the block) for every fenced block of every guide."""
    found = []
    for page in GUIDES:
        text = open(page, encoding="utf-8").read()
        for m in FENCE.finditer(text):
            body = m.group(1).strip()
            inc = INCLUDE.match(body)
            assert inc and "\n" not in body, (
                f"{_rel(page)}: a code block that is not one sample include (put it in docs/samples/ and "
                f'include it with --8<-- "NAME"): {body[:200]!r}')
            found.append((page, inc.group(1), text[:m.start()]))
    return found


RUN_SAMPLES = [s for s in _samples() if not s.startswith(("notrun" + os.sep, "launchers" + os.sep))]
LAUNCHER_TESTS = os.path.join(ROOT, "tests", "launchers", "test_launchers.py")


def test_guides_show_only_samples_and_every_sample_is_shown():
    incs = _includes()
    assert len(incs) >= 10, incs
    shown = {s for _, s, _ in incs}
    for _, s, _ in incs:
        assert os.path.isfile(os.path.join(SAMPLES, s)), f"included sample {s} is not in docs/samples"
    samples = set(_samples())
    assert samples - shown == set(), f"samples no guide shows: {sorted(samples - shown)}"
    for s in RUN_SAMPLES:
        assert s.endswith(RUNNERS), f"docs/samples/{s}: no runner for this kind (move it to notrun/ and say so)"


def test_not_run_samples_are_marked_on_their_page():
    incs = _includes()
    notrun = [(p, s, before) for p, s, before in incs if s.startswith("notrun/")]
    assert notrun, "expected the samples nothing here runs (pip install from an index) under notrun/"
    for page, s, before in notrun:
        # the paragraph just before the block says so
        last = before.rstrip().rsplit("\n\n", 1)[-1]
        assert re.search(r"not run", last, re.I), f"{_rel(page)}: {s} is not run, and the text before it does not say so"
    for page, s, before in incs:
        if not s.startswith("notrun/"):
            last = before.rstrip().rsplit("\n\n", 1)[-1]
            assert not re.search(r"\bnot run\b", last, re.I), f"{_rel(page)}: {s} is run but marked not run"


def test_launcher_samples_are_run_by_the_launcher_tests():
    src = open(LAUNCHER_TESTS, encoding="utf-8").read()
    launchers = [s for s in _samples() if s.startswith("launchers" + os.sep)]
    assert launchers, "docs/samples/launchers/ is empty"
    for s in launchers:
        assert f'"{os.path.basename(s)}"' in src, f"docs/samples/{s} is run by no case of {_rel(LAUNCHER_TESTS)}"


def _env():
    e = dict(os.environ)
    e["PATH"] = os.pathsep.join([BUILD, os.path.dirname(sys.executable), e.get("PATH", "")])
    e["PYTHONUNBUFFERED"] = "1"
    e["OMP_NUM_THREADS"] = "1"
    return e


def _need_build():
    for f in ("nexar", "libnexar.so"):
        assert os.path.exists(os.path.join(BUILD, f)), f"build/{f} is missing: run make build lib"


@pytest.mark.parametrize("sample", [s for s in RUN_SAMPLES if s.endswith(".py")])
def test_python_sample_runs_on_two_ranks(sample):
    outs = run_ranks(2, [os.path.join(SAMPLES, sample)], timeout=240, torchrun_env=True)
    assert len(outs) == 2


@pytest.mark.parametrize("sample", [s for s in RUN_SAMPLES if s.endswith(".sh")])
def test_shell_sample_runs(sample):
    _need_build()
    path = os.path.join(SAMPLES, sample)
    first = open(path, encoding="utf-8").readline()
    cwd = ROOT if "from the repository root" in first else SAMPLES
    p = subprocess.run(["bash", "-e", path], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, f"{sample} failed ({p.returncode}):\n{p.stdout[-6000:]}"


@pytest.mark.parametrize("sample", [s for s in RUN_SAMPLES if s.endswith((".c", ".cpp"))])
def test_c_sample_compiles_and_runs_on_two_ranks(sample, tmp_path):
    _need_build()
    src = os.path.join(SAMPLES, sample)
    exe = str(tmp_path / "prog")
    if sample.endswith(".c"):
        cmd = [shutil.which("cc") or "cc", "-std=c11", "-Wall", "-Werror"]
    else:
        cmd = [shutil.which("c++") or "c++", "-std=c++17", "-Wall", "-Werror",
               "-I" + os.path.join(ROOT, "bindings", "cpp", "include")]
    cmd += ["-I" + os.path.join(ROOT, "include"), src, "-L" + BUILD, "-lnexar", "-Wl,-rpath," + BUILD, "-o", exe]
    c = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert c.returncode == 0, f"{sample} does not compile:\n{c.stdout}"
    env = _env()
    env.pop("NEXAR_CLI", None)
    r = subprocess.run(["sh", os.path.join(ROOT, "tests", "c", "launch.sh"), "2", exe], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, f"{sample} failed on 2 ranks:\n{r.stdout[-6000:]}"


# --- the generated C API reference ---------------------------------------

def test_c_reference_covers_every_function_of_the_header():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import gen_capi_docs
    finally:
        sys.path.pop(0)
    page = gen_capi_docs.render()
    headings = "\n".join(l for l in page.splitlines() if l.startswith("### "))
    h = open(os.path.join(ROOT, "include", "nexar.h"), encoding="utf-8").read()
    h = re.sub(r"/\*.*?\*/", "", h, flags=re.S)
    fns = set(re.findall(r"^[a-z][\w\s\*]*?\b(nexar_\w+)\s*\(", h, re.M))
    assert len(fns) > 60 and "nexar_comm_init" in fns and "nexar_iexscan" in fns, fns
    missing = sorted(f for f in fns if not re.search(rf"\b{f}\b", headings))
    assert missing == [], f"functions of nexar.h without a heading on the C API page: {missing}"
    # the header's own words, not a copy
    assert "Counts are size\\_t and count ELEMENTS" in page


# --- the environment variable reference ----------------------------------

def _header_names():
    h = open(os.path.join(ROOT, "include", "nexar.h"), encoding="utf-8").read()
    # enum constants and macros, not the variables its comments mention
    return set(re.findall(r"\b(NEXAR_[A-Z0-9_]+)\s*=", h)) | set(re.findall(r"#define\s+(NEXAR_[A-Z0-9_]+)", h))


def _vars_read_by_code():
    names = set()
    for d in ("core", "transport", "capi", "cmd", "hw", "membership", "nexar", "internal", "collective", "compress"):
        for f in glob.glob(os.path.join(ROOT, d, "**", "*.go"), recursive=True):
            if f.endswith("_test.go"):
                continue
            names |= set(re.findall(r'"(NEXAR_[A-Z0-9_]+)"', open(f, encoding="utf-8").read()))
    for f in glob.glob(os.path.join(ROOT, "bindings", "python", "nexar", "**", "*.py"), recursive=True):
        names |= set(re.findall(r'environ(?:\.get)?\s*[\(\[]\s*"(NEXAR_[A-Z0-9_]+)"', open(f, encoding="utf-8").read()))
    # ABI constants (NEXAR_SUM, NEXAR_ERR_*) and the Python error's name are not variables
    return names - _header_names() - {"NEXAR_ERROR"}


def test_every_variable_the_code_reads_is_documented():
    read = _vars_read_by_code()
    assert {"NEXAR_RANK", "NEXAR_SEED", "NEXAR_DEBUG", "NEXAR_ADVERTISE_HOST", "NEXAR_CUDART"} <= read, read
    env_page = open(os.path.join(DOCS, "reference", "env.md"), encoding="utf-8").read()
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    tests_only = env_page.split("## Tests only", 1)[1] if "## Tests only" in env_page else ""
    for name in sorted(read):
        assert f"`{name}`" in env_page, f"{name} is read by the code but not on docs/reference/env.md"
        if f"`{name}`" not in tests_only:
            assert f"`{name}`" in readme, f"{name} is read by the code but not in README's variable table"
