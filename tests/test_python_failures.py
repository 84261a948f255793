"""A Python step ends as `python -c "import ..."` ends: the same exit status, the same exception
line, the same exit path, whatever the module does while it is imported. Each case is a module
that an extension imports (`py:` takes an extension: `build/fixtures/pysteps/boot.so`, copied
under each case's name), run once by loadfuzz and once by real CPython, and compared."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadfuzz.classify import DETAIL_LIMIT
from support import FIXTURES, LOADFUZZ, loadfuzz

BOOT = FIXTURES / "pysteps" / "boot.so"
SUFFIX = ".cpython-311-x86_64-linux-gnu.so"

# case -> the source of the module `boot_<case>` imports (the names are those pyext_boot.c knows)
CASES = {
    "exit3": "import sys\nsys.exit(3)\n",
    "exitmsg": "import sys\nsys.exit('case_exitmsg: no accelerator here')\n",
    "nul": "raise ImportError('bad\\x00thing')\n",
    "surrogate": "raise ImportError('bad \\udcff\\ud800 name')\n",
    "badstr": "class E(Exception):\n    def __str__(self):\n        raise ValueError\nraise E()\n",
    "custom": "class ConfigError(Exception):\n    pass\nraise ConfigError('bad config')\n",
    "logmiss": ("try:\n    import loadfuzz_fixture_accelerator_nobody_installed\n"
                "except ModuleNotFoundError as exc:\n    print('warning: running without:', exc)\n"
                "raise RuntimeError('case_logmiss: operator table corrupted')\n"),
    "chained": ("try:\n    import loadfuzz_fixture_dependency_nobody_installed\n"
                "except ImportError as exc:\n"
                "    raise ImportError('initialization failed') from exc\n"),
    # the missing module was handled: the error raised while handling it is the failure
    "fallback": ("try:\n    import loadfuzz_fixture_accelerator_nobody_installed\n"
                 "except ImportError:\n"
                 "    raise RuntimeError('case_fallback: operator table corrupted')\n"),
    "sigpipe": "import os\nr, w = os.pipe()\nos.close(r)\nos.write(w, b'x')\n",
    "argv": "import sys\nif sys.argv != ['-c']:\n    raise RuntimeError(f'argv is {sys.argv!r}')\n",
    # a warning is shown (here: the process ends) only where CPython's filters show it
    "depwarn": ("import os, warnings\nwarnings.showwarning = lambda *args, **kwargs: os._exit(9)\n"
                "warnings.warn('case_depwarn is deprecated', DeprecationWarning, stacklevel=2)\n"),
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(4))\n",
    "kbint": "raise KeyboardInterrupt\n",  # python ends by SIGINT, after its traceback
    # a warning attributed two frames above the import: past python -c's one frame, to sys,
    # where CPython's filters hide a DeprecationWarning (a frame of ours would show it)
    "callers": ("import os, warnings\nwarnings.showwarning = lambda *args, **kwargs: os._exit(9)\n"
                "warnings.warn('case_callers is deprecated', DeprecationWarning, stacklevel=3)\n"),
    # a module that puts another object in its place in sys.modules
    "proxy": ("import sys, types\n"
              "sys.modules['boot_proxy'] = types.SimpleNamespace(answer=42)\n"),
    "thread": ("import os, threading, time\n"
               "threading.Thread(target=lambda: (time.sleep(0.2), os._exit(5))).start()\n"),
    # a message of several lines (torch's `TORCH_LOGS` error is one)
    "multiline": "raise ValueError('\\nInvalid settings: foo\\nValid settings: a, b')\n",
    # a message that quotes the traceback of a missing module it was handling
    "quoted": ("import traceback\ntry:\n    import loadfuzz_fixture_accelerator_nobody_installed\n"
               "except ImportError:\n    raise RuntimeError('case_quoted: backend failed to load:\\n'"
               " + traceback.format_exc()) from None\n"),
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pysteps")
    for case, source in CASES.items():
        shutil.copyfile(BOOT, folder / f"boot_{case}{SUFFIX}")
        (folder / f"case_{case}.py").write_text(source)
    return folder


def cpython(folder: Path, case: str, cwd: Path) -> subprocess.CompletedProcess:
    """Real CPython importing the case, as a user would: `python -c`, in an empty folder."""
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(folder)!r}); import boot_{case}"],
        cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def agrees(record: dict, real: subprocess.CompletedProcess) -> bool:
    """Whether loadfuzz's verdict is what CPython did: clean for status 0, the same signal, an
    exception whose line CPython printed (its last line, unless a signature named a line of
    its chain), or an exit with the same status. (A record's text writes a NUL as \\x00.)"""
    lines = [line.replace("\0", "\\x00") for line in real.stderr.splitlines() if line.strip()]

    def last(count: int) -> str:  # the last lines, as one (a message of several lines)
        return " ".join(line.strip() for line in lines[-count:])[:DETAIL_LIMIT]

    if real.returncode == 0:
        return record["outcome"] == "clean"
    if real.returncode < 0:
        return record["signal"] == -real.returncode
    if "Traceback (most recent call last):" in real.stderr:
        named = record["detail"] in map(last, range(1, len(lines))) if record["signature"] is None else (
            record["detail"] in lines)
        return record["outcome"] == "load-error" and named
    return record["outcome"] == "exit" and record["exit_code"] == real.returncode


def run_case(folder: Path, case: str, *options: str) -> dict:
    done = loadfuzz("run", "--json", *options, f"py:{folder / f'boot_{case}{SUFFIX}'}")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_python_step_ends_as_cpython_importing_it_ends(modules, case, tmp_path):
    # --at-exit: the trial ends as the python program does (Python finalized, then exit())
    record = run_case(modules, case, "--at-exit")
    real = cpython(modules, case, tmp_path)
    assert agrees(record, real), (record["outcome"], record["detail"], real.returncode,
                                  real.stderr[-600:])


def test_an_exception_reads_as_the_last_line_cpython_prints(modules):
    assert run_case(modules, "custom")["detail"] == "case_custom.ConfigError: bad config"
    assert run_case(modules, "nul")["detail"] == "ImportError: bad\\x00thing"
    assert run_case(modules, "badstr")["detail"] == "case_badstr.E: <exception str() failed>"


def test_an_exception_whose_message_spans_lines_reads_as_one_line(modules):
    assert run_case(modules, "multiline")["detail"] == (
        "ValueError: Invalid settings: foo Valid settings: a, b")


def test_a_missing_module_quoted_in_the_message_does_not_name_the_failure(modules):
    record = run_case(modules, "quoted")
    assert (record["outcome"], record["signature"]) == ("load-error", None)
    assert record["detail"].startswith(
        "RuntimeError: case_quoted: backend failed to load: Traceback (most recent call last):")


def test_sys_exit_while_importing_ends_the_process_with_its_status(modules):
    record = run_case(modules, "exit3")
    assert (record["outcome"], record["exit_code"], record["step"]) == ("exit", 3, 0)


def test_a_missing_module_is_named_by_the_exception_chain_not_by_what_was_printed(modules):
    chained, printed = run_case(modules, "chained"), run_case(modules, "logmiss")
    assert (chained["signature"], chained["op"]) == (
        "python-missing-module", "loadfuzz_fixture_dependency_nobody_installed")
    assert (printed["signature"], printed["detail"]) == (
        None, "RuntimeError: case_logmiss: operator table corrupted")


def test_a_missing_module_the_failing_code_was_handling_does_not_name_the_failure(modules):
    record = run_case(modules, "fallback")
    assert (record["outcome"], record["signature"], record["detail"]) == (
        "load-error", None, "RuntimeError: case_fallback: operator table corrupted")


def test_without_at_exit_a_trial_ends_once_its_last_step_is_done(modules):
    assert run_case(modules, "atexit")["outcome"] == "clean"
    assert run_case(modules, "atexit", "--at-exit")["exit_code"] == 4


@pytest.mark.parametrize("how", ["python -m loadfuzz in the parent folder", "PYTHONPATH"])
def test_a_module_is_named_from_the_import_path_the_trial_has_not_loadfuzzs_own(tmp_path, how):
    # the working folder (first on `python -m`'s path) and PYTHONPATH are loadfuzz's only: a
    # trial has neither, so they must not name the module (`pkgdir.boot_argv` would not import)
    (tmp_path / "pkgdir").mkdir()
    module = tmp_path / "pkgdir" / f"boot_argv{SUFFIX}"
    shutil.copyfile(BOOT, module)
    (tmp_path / "pkgdir" / "case_argv.py").write_text(CASES["argv"])
    env = {**os.environ, "PYTHONPATH": str(tmp_path)} if how == "PYTHONPATH" else None
    command = [sys.executable, "-m", "loadfuzz"] if how.startswith("python -m") else [LOADFUZZ]
    done = subprocess.run([*map(str, command), "run", "--json", f"py:{module}"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    record = json.loads(done.stdout)
    real = cpython(module.parent, "argv", tmp_path)  # its folder first: how a trial imports it
    assert real.returncode == 0 and record["outcome"] == "clean", record["detail"]
