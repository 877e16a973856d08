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
import json, os, sys, time
{prelude}
from featcache.cli import main
cases, base = json.loads(sys.argv[1]), sys.argv[2]
found = []
for number, (args, env) in enumerate(cases):
    sys.stdout.flush(); sys.stderr.flush()
    began = time.monotonic()
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
    found.append([os.waitstatus_to_exitcode(status), time.monotonic() - began])
print(json.dumps(found))
"""


class Case(subprocess.CompletedProcess):
    """One command of :func:`run_many`: its exit code, stdout, stderr and seconds."""

    def __init__(self, args, returncode, stdout, stderr, seconds):
        super().__init__(args, returncode, stdout, stderr)
        self.seconds = seconds

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_many(cases: list, cwd: Path, prelude: str = "", env: dict | None = None,
             user: int | None = None, timeout: float = 300) -> list[Case]:
    """Run ``featcache ARGS`` for each case (``ARGS``, or ``(ARGS, ENV)`` with ENV added to the
    environment of that case), each through the console entry point (``main``: its exit codes
    and one-line errors) in its own process, forked from one that imported the command line
    and ran ``prelude`` once (``import torch``, or code that slows a step: :data:`SLEEP_IN`):
    the real command, for one interpreter start and one import of torch per group. Each case's
    stdout and stderr are what its file descriptors 1 and 2 received (its forked workers'
    output included). ``user``: run as that uid (and group), without root's right to write
    anywhere (``setpriv``)."""
    normal = [([str(word) for word in case[0]], case[1]) if isinstance(case, tuple)
              else ([str(word) for word in case], {}) for case in cases]
    base = Path(tempfile.mkdtemp(prefix="featcache-many-")) / "case"
    code = MANY.format(prelude=f"{SLEEP_IN}\n{prelude}")
    command = [sys.executable, "-c", code, json.dumps(normal), str(base)]
    if user is not None:
        os.chmod(base.parent, 0o777)
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "120", **(env or {})})
        if done.returncode != 0 or not done.stdout.strip():
            raise AssertionError(f"the cases did not finish (rc {done.returncode}):\n"
                                 f"{done.stdout}\n{done.stderr}")
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return [Case(["featcache", *args], code, *(Path(f"{base}-{number}.{name}").read_text()
                                                 for name in ("out", "err")), seconds)
                for number, ((args, _), (code, seconds)) in enumerate(zip(normal, found,
                                                                        strict=True))]
    finally:
        shutil.rmtree(base.parent, ignore_errors=True)


def digests(root: Path, leave_out: Path | None = None) -> dict[str, str]:
    """sha256 of every file below ``root`` but ``leave_out``: what "nothing lost" compares."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p != leave_out}


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


