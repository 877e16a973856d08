"""Running the command line in a subprocess with faults: slowed down, interrupted, size-limited.

``start`` runs ``featcache ARGS`` in its own process group (as a terminal's foreground job:
a Ctrl-C there reaches the DataLoader workers too) after executing ``prelude`` (Python code
that may slow a step down, so that a signal lands mid-run: ``_slow(cls, name, seconds, mark)``,
which can also leave a marker file as each slowed call begins). ``interrupt`` sends SIGINT to the
whole group, like Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SLEEP_IN = """
import time as _time
def _slow(cls, name, seconds, mark=""):
    original, calls = getattr(cls, name), []
    def slowed(*args, **kwargs):
        if mark:  # a file MARK-N as the N-th call (in this process) begins
            calls.append(None)
            open(f"{mark}-{len(calls)}", "w").close()
        _time.sleep(seconds)
        return original(*args, **kwargs)
    setattr(cls, name, slowed)
"""


#: stage two with two losses on two workers (the interrupt tests stop it between the losses)
LINEAR_AN_ROLE = ["train-linear", "--dataset", "toy", "--loss", "an,role", "--epochs", "3",
                  "--lr", "1e-2,1e-3", "--bsize", "8,16", "--jobs", "2", "--run-id", "r1",
                  "--quiet", "--no-plots", "--device", "cpu"]
#: stage two's steps slowed, ROLE's (0.3 s) far more than the others' (0.02 s): the other loss
#: of ``--loss an,role`` finishes first while ROLE still trains, whatever order the workers
#: take the pieces in (the costliest first)
SLOW_ROLE_STEPS = """
from featcache.linear.engine.trainer import GroupTrainer
_train_step = GroupTrainer.train_step
def _slowed_step(self, *args, **kwargs):
    _time.sleep(0.3 if any(m.member.loss == "role" for m in self.members) else 0.02)
    return _train_step(self, *args, **kwargs)
GroupTrainer.train_step = _slowed_step
"""


def start(args: list[str], cwd: Path, prelude: str = "", env: dict | None = None,
          shell_prefix: str = "", read_only: Path | None = None) -> subprocess.Popen:
    """``featcache ARGS`` in a new process group; ``shell_prefix`` (e.g. ``ulimit -f 64;``)
    runs it through ``sh -c``; ``read_only``: a folder the command sees mounted read-only
    (:func:`read_only_mount`)."""
    code = f"{SLEEP_IN}\n{prelude}\nimport sys\nfrom featcache.cli import main\nsys.argv = ['featcache', *{args!r}]\nmain()\n"
    command = [sys.executable, "-c", code]
    if shell_prefix:
        command = ["sh", "-c", f'{shell_prefix} exec "$0" "$@"', *command]
    if read_only is not None:
        command = [*read_only_mount(read_only), *command]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env={**os.environ, "COLUMNS": "120", **(env or {})})


def run(args: list[str], cwd: Path, prelude: str = "", env: dict | None = None,
        shell_prefix: str = "", timeout: float = 300, read_only: Path | None = None
        ) -> subprocess.CompletedProcess:
    process = start(args, cwd, prelude, env, shell_prefix, read_only)
    out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


#: the driver of :func:`run_many`: imports the command line (and ``prelude``) once, then runs
#: each case as ``featcache ARGS`` in a process forked from it, its output in two files
MANY = """
import json, os, sys
{prelude}
from featcache.cli import main
cases, base = json.loads(sys.argv[1]), sys.argv[2]
codes = []
for number, (args, env) in enumerate(cases):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, name in ((1, "out"), (2, "err")):
            handle = os.open(f"{{base}}-{{number}}.{{name}}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(handle, fd)
            os.close(handle)
        os.environ.update(env)
        sys.argv = ["featcache", *args]
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 99
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    codes.append(os.waitstatus_to_exitcode(status))
print(json.dumps(codes))
"""


def run_many(cases: list, cwd: Path, prelude: str = "", env: dict | None = None,
             user: int | None = None, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Run ``featcache ARGS`` for each case (``ARGS``, or ``(ARGS, ENV)`` with ENV added to the
    environment of that case), each in its own process, forked from one that imported the
    command line once (``prelude``: more to import first, e.g. ``import torch``): the real
    command, at the cost of one interpreter start for all of them. ``user``: run as that uid
    (and its group), without root's right to write anywhere (``setpriv``)."""
    normal = [(list(case), {}) if not isinstance(case, tuple) else (list(case[0]), case[1])
              for case in cases]
    base = Path(tempfile.mkdtemp(prefix="featcache-many-")) / "case"
    command = [sys.executable, "-c", MANY.format(prelude=prelude), json.dumps(normal), str(base)]
    if user is not None:
        os.chmod(base.parent, 0o777)
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "120", **(env or {})})
    assert done.returncode == 0, done.stderr
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    results = []
    for number, (args, _) in enumerate(normal):
        out, err = (Path(f"{base}-{number}.{name}").read_text() for name in ("out", "err"))
        results.append(subprocess.CompletedProcess(["featcache", *args], codes[number], out, err))
    shutil.rmtree(base.parent, ignore_errors=True)
    return results


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one featcache line of a refused command (checked: exit 1, or click's 2 for a bad
    option, no traceback, nothing unexpected), without its ``Error: ``."""
    assert result.returncode in (1, 2), (result.args, result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, (result.args, result.stderr)
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr, result.stderr
    return lines[0].removeprefix("Error: ")


def wait_for(condition, process: subprocess.Popen, timeout: float = 120) -> None:
    """Poll ``condition()`` until it holds; fail with the process's output if it exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the process ended (rc {process.returncode}) before the "
                                 f"condition held:\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting for the condition")
        time.sleep(0.1)


def interrupt(process: subprocess.Popen, times: int = 1, gap: float = 0.3,
              timeout: float = 60, signum: int = signal.SIGINT, group: bool = True
              ) -> tuple[float, str, str]:
    """Ctrl-C (or ``signum``) ``times`` times, to the whole process group (else to the process
    alone, as ``kill PID``); (seconds from the first signal to the exit, stdout, stderr)."""
    started = time.monotonic()
    for index in range(times):
        if index:
            time.sleep(gap)
        if group:
            os.killpg(process.pid, signum)
        else:
            os.kill(process.pid, signum)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return time.monotonic() - started, out, err


def group_gone(process) -> bool:
    """Whether no live process of the command's process group (its forked workers) is left
    (zombies, already dead, are not counted)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == process.pid and fields[0] != "Z":  # (state, ppid, pgrp, ...)
            return False
    return True


def read_only_mount(folder: Path) -> list[str]:
    """The command prefix that runs a command with ``folder`` bind-mounted read-only over itself,
    in a private mount namespace (``unshare``; a user namespace, so no privilege is needed where
    the kernel allows them): what a read-only shared or archived cache is. Root, who may write
    where permission bits say no, gets EROFS there like anyone."""
    quoted = shlex.quote(str(folder))
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
            f'mount --bind -o ro {quoted} {quoted} && exec "$0" "$@"']


def can_mount_read_only(scratch: Path) -> str | None:
    """None when :func:`read_only_mount` works here, else why not (for ``pytest.skip``)."""
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        probe = subprocess.run([*read_only_mount(scratch), "sh", "-c", f"touch {shlex.quote(str(scratch))}/x"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not available: {exc}"
    if "Read-only file system" not in probe.stderr:
        return f"a read-only bind mount is not possible here: {probe.stderr.strip() or probe.returncode}"
    return None


#: the marker before :func:`run_many`'s JSON report on stdout
_MANY_MARK = "\n==featcache-cases==\n"
_MANY = """
import json, os, sys, tempfile, time
from featcache.cli import main
found = []
for args in CASES:
    # each case's output as the terminal would get it: file descriptors 1 and 2 go to files,
    # so that what forked workers print is the case's too
    sys.stdout.flush(); sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    files = [tempfile.TemporaryFile(mode="w+", encoding="utf-8") for _ in range(2)]
    for fd, file in zip((1, 2), files):
        os.dup2(file.fileno(), fd)
    code, began = 0, time.monotonic()
    try:
        sys.argv = ["featcache", *args]
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
    texts = []
    for file in files:
        file.seek(0)
        texts.append(file.read())
        file.close()
    found.append([code, texts[0], texts[1], time.monotonic() - began])
sys.stdout.write(MARK + json.dumps(found))
"""


class Case(subprocess.CompletedProcess):
    """One command of :func:`run_many`: its exit code, stdout, stderr and seconds."""

    def __init__(self, args, returncode, stdout, stderr, seconds):
        super().__init__(args, returncode, stdout, stderr)
        self.seconds = seconds

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_many(cases: list[list[str]], cwd: Path, prelude: str = "", env: dict | None = None,
             timeout: float = 300) -> list[Case]:
    """Each of ``cases`` as ``featcache ARGS`` through the console entry point (``main``: its
    exit codes and one-line errors), one after the other in ONE subprocess, so that a group of
    cases pays for importing torch once; each case's stdout and stderr are what its file
    descriptors 1 and 2 received (forked workers' output included)."""
    cases = [[str(word) for word in case] for case in cases]
    code = f"{SLEEP_IN}\n{prelude}\nCASES = {cases!r}\nMARK = {_MANY_MARK!r}\n{_MANY}"
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "120", **(env or {})})
    if _MANY_MARK not in done.stdout:
        raise AssertionError(f"the cases did not finish (rc {done.returncode}):\n{done.stdout}\n"
                             f"{done.stderr}")
    import json

    found = json.loads(done.stdout.split(_MANY_MARK, 1)[1])
    return [Case(case, *result) for case, result in zip(cases, found, strict=True)]
