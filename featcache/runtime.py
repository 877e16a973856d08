"""Where and how work runs: the device, the precision, the ranks of a ``torchrun`` job, threads
and the process-wide backend flags.

Every stage asks this module instead of deciding for itself, and every flag it sets is set
inside :func:`backend_flags` and restored when the block ends, so nothing leaks into whatever
runs next in the same process (a test, a notebook, the next stage of a pipeline).

``torchrun --nproc_per_node N -m featcache ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; :func:`ranks` then joins the process group (NCCL on GPUs, gloo on the CPU) and
gives every rank the device ``cuda:LOCAL_RANK``. Without those variables it is a world of one
and nothing is initialised.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

from featcache.environment import LOCAL_RANK, LOCAL_WORLD_SIZE, OMP_THREADS, RANK, WORLD_SIZE
from featcache.errors import FeatcacheError, OptionError, plural
from featcache.interrupt import check_stop
from featcache.notices import notice_cpu_fallback

T = TypeVar("T")

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: ranks wait for each other at the end; a rank with more or slower images may be minutes late
WAIT = _dt.timedelta(hours=2)


# ------------------------------------------------------------------------------------- devices
def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``--device``: auto (cuda when available), cpu, cuda or cuda:N.

    Under torchrun plain ``cuda``/``auto`` mean this rank's GPU, ``cuda:LOCAL_RANK``. ``auto``
    on a machine without CUDA runs on the CPU and says so (a :class:`FeatcacheWarning`).
    """
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        else:
            notice_cpu_fallback()
            name = "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise OptionError(f"--device {name!r}: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise OptionError("--device cuda: CUDA is not available on this machine; use --device cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise OptionError(f"--device {device}: this machine has {torch.cuda.device_count()} GPUs")
    elif device.type != "cpu":
        raise OptionError(f"--device {name!r}: featcache supports cpu and cuda devices")
    return device


def describe_device(device: torch.device) -> str:
    """``cpu`` or ``cuda (NVIDIA H100 80GB HBM3)``: what results files record."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return "cpu"


# ------------------------------------------------------------------------------------ precision
def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 on GPUs that have it, else fp16; fp32 on the CPU."""
    if precision not in PRECISIONS:
        raise OptionError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def autocast(device: torch.device, precision: str):
    """The autocast context of a resolved precision (a no-op for fp32)."""
    dtype = AUTOCAST_DTYPES.get(precision)
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


# ---------------------------------------------------------------------------------- CPU threads
def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_processes(asked: int | None, ranks_here: int = 1) -> tuple[int, str | None]:
    """Stage two's CPU worker processes, one core each: ``asked`` (``--jobs``) capped at what
    can run at once, the CPUs of this process shared among the ``ranks_here`` ranks on this
    machine (default: that many); and a line saying so when ``asked`` was capped (more
    processes than cores only take turns, and each costs memory)."""
    cores = max(1, usable_cpus() // max(1, ranks_here))
    if asked is None or asked <= cores:
        return asked or cores, None
    shared = f", shared among {plural(ranks_here, 'rank')}" if ranks_here > 1 else ""
    return cores, (f"--jobs {asked}: {plural(usable_cpus(), 'CPU')} can run "
                   f"{plural(cores, 'worker process', 'worker processes')} at once{shared} (one "
                   f"core each); running {cores}")


def cpu_threads() -> int:
    """Threads for a CPU forward pass: ``$OMP_NUM_THREADS`` when set (torchrun sets 1), else
    the CPUs of this machine shared among the ranks on it. The count is part of a stage-one
    run's identity: oneDNN's sums, hence the last bits of the features, depend on it."""
    threads = OMP_THREADS.value()
    if threads is not None:
        return int(threads)
    _, _, _, local_world = torchrun_world()
    return max(1, usable_cpus() // max(1, local_world))


def training_threads(device: torch.device, workers: int) -> int | None:
    """Intra-op threads of a training process whose DataLoader workers decode on the same CPUs:
    on the CPU, this rank's share of the CPUs less one (at least 1), so that the compute threads
    never wait at a barrier for a thread a decoding worker has pushed off its core (on 2 cores,
    2 threads beside 1 worker made a fine-tuning step 4x the CPU time of 1 thread: spinning
    threads; docs/finetune.md). Not less one per worker: the thread count changes a
    convolution's summation order, and the numbers must not depend on ``--workers``.
    ``$OMP_NUM_THREADS`` wins when set; None off the CPU (the default applies)."""
    if device.type != "cpu":
        return None
    if OMP_THREADS.value() is not None:
        return cpu_threads()
    return max(1, cpu_threads() - 1)


def default_workers(device: torch.device, local_world: int = 1) -> int:
    """DataLoader workers decoding images. GPU: every CPU this rank can have but one (decoding
    must keep the GPU busy); CPU: one worker (the model is the bottleneck), none on one core."""
    cpus = max(1, usable_cpus() // max(1, local_world))
    if device.type == "cuda":
        return max(1, min(cpus - 1, 32))
    return 1 if cpus >= 2 else 0


def default_batch_size(device: torch.device) -> int:
    """Images per forward pass when the user does not say: 256 on a GPU, 32 on the CPU."""
    return 256 if device.type == "cuda" else 32


# -------------------------------------------------------------------------------- backend flags
@contextmanager
def backend_flags(device: torch.device, precision: str = "fp32", *, cudnn_benchmark: bool = False,
                  threads: int | None = None, deterministic: bool = False) -> Iterator[None]:
    """Set the process-wide flags a block of work needs, and restore them afterwards.

    - CPU: ``threads`` intra-op threads (default :func:`cpu_threads`).
    - GPU: ``cudnn.benchmark`` when asked (fixed shapes: let cuDNN pick its fastest kernels);
      with ``precision == "fp32"`` IEEE float32 convolutions and matmuls (no TF32), so that
      ``--precision fp32`` means fp32. Only PyTorch's ``fp32_precision`` API is used (not the
      legacy ``allow_tf32`` flags: the two must not be mixed).
    - GPU, ``deterministic``: deterministic cuDNN algorithms and PyTorch's deterministic
      implementations (``torch.use_deterministic_algorithms``, warning where an operation has
      none), no autotuner: the same run gives the same bits, so a resumed run equals an
      uninterrupted one. cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` for that; it is set to
      ``:4096:8`` unless already set (it must be set before cuBLAS starts).
    """
    if device.type == "cpu":
        with intraop_threads(threads or cpu_threads()):
            yield
        return
    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, fp32_modes(), cudnn.deterministic,
              torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn.benchmark = cudnn_benchmark and not deterministic
    if precision == "fp32":
        set_fp32_modes(IEEE)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        cudnn.benchmark = before[0]
        set_fp32_modes(before[1])
        cudnn.deterministic = before[2]
        torch.use_deterministic_algorithms(before[3], warn_only=before[4])


#: convolutions and matmuls in IEEE float32 (no TF32)
IEEE = ("ieee", "ieee")


def _has_precision_api() -> bool:
    """Whether this PyTorch has the ``fp32_precision`` API (2.9 and later)."""
    return (hasattr(torch.backends.cudnn, "conv")
            and hasattr(torch.backends.cudnn.conv, "fp32_precision")
            and hasattr(torch.backends.cuda.matmul, "fp32_precision"))


class _Fp32Switch(Protocol):
    fp32_precision: str


def _cudnn_conv() -> _Fp32Switch:
    """``torch.backends.cudnn.conv``: the convolutions' switch of the ``fp32_precision`` API,
    which exists at run time but is missing from torch's own type annotations."""
    return getattr(torch.backends.cudnn, "conv")  # noqa: B009 - see the docstring


def fp32_modes() -> tuple[str, str]:
    """(convolutions, matmuls): ``ieee`` or ``tf32`` (``none``: PyTorch's default), read
    through the ``fp32_precision`` API, or from the legacy ``allow_tf32`` flags on a PyTorch
    that predates it (the two APIs are never mixed)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if _has_precision_api():
        return _cudnn_conv().fp32_precision, matmul.fp32_precision
    return ("tf32" if cudnn.allow_tf32 else "ieee"), ("tf32" if matmul.allow_tf32 else "ieee")


def set_fp32_modes(modes: tuple[str, str]) -> None:
    """Undo :func:`fp32_modes` (or force :data:`IEEE`)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if _has_precision_api():
        conv = _cudnn_conv()
        conv.fp32_precision, matmul.fp32_precision = modes
    else:
        cudnn.allow_tf32, matmul.allow_tf32 = (mode == "tf32" for mode in modes)


@contextmanager
def intraop_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads (PyTorch's thread count is process-wide)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, int(count)))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# -------------------------------------------------------------------------------------- ranks
@dataclass
class Ranks:
    """This process's place in a ``torchrun`` job (a world of one without torchrun)."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def agree(self, failed: bool, count: int = 0) -> tuple[bool, int]:
        """Every rank reports (failed, count); all get (any failed, total count)."""
        if self.world == 1:
            return failed, count
        where = self.device if self.device.type == "cuda" else torch.device("cpu")
        state = torch.tensor([int(failed), count], dtype=torch.int64, device=where)
        dist.all_reduce(state)
        return bool(state[0].item()), int(state[1].item())

    def together(self, step: Callable[[], object]):
        """Run ``step`` on every rank; if it fails anywhere, fail everywhere (no rank hangs)."""
        error, result = None, None
        try:
            result = step()
        except Exception as exc:  # re-raised below, after the other ranks have been told
            error = exc
        failed, _ = self.agree(error is not None)
        if error is not None:
            raise error
        if failed:
            check_stop()  # stopped by Ctrl-C while the others stopped: say so, not "failed"
            raise FeatcacheError("another rank failed (see its message); run the same command "
                                 "again to resume")
        return result


def on_main(job: Ranks | None, step: Callable[[], T]) -> T:
    """Run ``step`` on rank 0 only and hand its result to every rank (errors stop all ranks):
    what writes a file, or decides a name, once for the whole job."""
    if job is None or job.world == 1:
        return step()
    result = job.together(lambda: step() if job.is_main else None)
    shared = [result]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def single_process(device: torch.device) -> Ranks:
    """A world of one on ``device`` (what the Python API and tests use)."""
    return Ranks(0, 1, 0, 1, device)


def torchrun_world() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from the torchrun environment."""
    world = int(WORLD_SIZE.value(1))
    rank = int(RANK.value(0))
    local_rank = int(LOCAL_RANK.value(0))
    local_world = int(LOCAL_WORLD_SIZE.value(world))
    return rank, world, local_rank, local_world


@contextmanager
def ranks(device_name: str = "auto") -> Iterator[Ranks]:
    """This process's :class:`Ranks`; joins (and afterwards leaves) the process group if needed."""
    rank, world, local_rank, local_world = torchrun_world()
    device = pick_device(device_name, local_rank)
    if world == 1:
        yield single_process(device)
        return
    joined = False
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=WAIT, device_id=device)
        else:
            dist.init_process_group("gloo", timeout=WAIT)
        joined = True
    try:
        yield Ranks(rank, world, local_rank, local_world, device)
    finally:
        if joined:
            dist.destroy_process_group()


@functools.cache
def cpu_arithmetic() -> str:
    """A short fingerprint of this process's CPU float32 matrix arithmetic: the bits of a few
    seeded products shaped like stage two's steps (mm, its transposed gradient, bmm).

    The BLAS library picks its kernels by the processor's instruction set (MKL's AVX2 and
    AVX-512 paths sum in different orders), and that choice alone moves stage two's numbers
    in their last digits; the thread count does not. Two runs of the same settings whose
    records carry the same fingerprint give the same numbers bit for bit (docs/linear.md,
    "Same seed, same numbers").
    """
    generator = torch.Generator().manual_seed(20261128)
    x = torch.randn(37, 294, generator=generator)
    w = torch.randn(294, 6, generator=generator)
    g = torch.randn(37, 6, generator=generator)
    xs = torch.randn(4, 8, 294, generator=generator)
    ws = torch.randn(4, 294, 6, generator=generator)
    with torch.no_grad():
        products = (x @ w, x.T @ g, torch.bmm(xs, ws), torch.addmm(g, x, w))
    digest = hashlib.sha256()
    for product in products:
        digest.update(product.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
