"""What keeps groups trained at once on one GPU apart, checked on the CPU with stand-ins for
CUDA's streams and graphs: each group's streams are its own (PyTorch hands out a pool of 32,
round-robin), a step's branches are joined even when one fails, and a capture that fails is
contained (first cause named, memory pool given back, one capture at a time) or, where its
streams are left capturing, says so in a way the search answers by training the group again
without graphs. The H200 run of 2026-11-28 met each of these."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

import featcache.linear.engine.graphs as graphs_module
import featcache.linear.engine.streams as streams_module
from featcache.linear.engine.graphs import (
    MAX_BRANCHES,
    Branches,
    CaptureFailed,
    StreamsLeftCapturing,
    capture_graph,
    is_capture_error,
)
from featcache.linear.engine.streams import StreamLease

POOL = 32
CUDA = torch.device("cuda", 0)


class FakeStream:
    """A stream of the fake pool: its handle, and what was asked of it."""

    def __init__(self, handle: int, log: list):
        self.cuda_stream, self.log = handle, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait", self.cuda_stream, other.cuda_stream))

    def synchronize(self) -> None:
        self.log.append(("synchronize", self.cuda_stream))


class FakePool:
    """PyTorch's stream pool: 32 streams per device, handed out round-robin."""

    def __init__(self):
        self.log: list = []
        self.streams = [FakeStream(1000 + i, self.log) for i in range(POOL)]
        self.next = 0
        self.lock = threading.Lock()

    def draw(self, device) -> FakeStream:
        with self.lock:
            stream = self.streams[self.next % POOL]
            self.next += 1
            return stream


def test_the_pool_hands_out_the_same_stream_again_and_the_lease_does_not():
    pool = FakePool()
    drawn = [pool.draw(CUDA).cuda_stream for _ in range(POOL + 1)]
    assert drawn[0] == drawn[POOL]  # what two groups got on the H200
    lease = StreamLease(pool.draw)
    taken: list[list] = []
    barrier = threading.Barrier(4)

    def group():
        barrier.wait()
        taken.append(lease.take(CUDA, 2 + MAX_BRANCHES))

    threads = [threading.Thread(target=group) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    handles = [s.cuda_stream for streams in taken for s in streams]
    assert len(handles) == 4 * (2 + MAX_BRANCHES) == len(set(handles))
    assert lease.most_held == 24
    more = lease.take(CUDA, 10)  # the pool has 8 left: the caller makes do with them
    assert len(more) == 8 and not {s.cuda_stream for s in more} & set(handles)
    assert lease.take(CUDA, 1) == []
    lease.give_back(taken[0])
    again = lease.take(CUDA, 6)
    assert {s.cuda_stream for s in again} == {s.cuda_stream for s in taken[0]}
    lease.retire(again[:1])
    lease.give_back(again[1:])
    assert again[0].cuda_stream not in {s.cuda_stream for s in lease.take(CUDA, 10)}


@pytest.fixture
def fake_cuda(monkeypatch):
    """Branches and captures over the fake pool, on the CPU: the current stream, the stream
    context and the capture status are the fakes'."""
    pool = FakePool()
    lease = StreamLease(pool.draw)
    main = FakeStream(1, pool.log)
    current = [main]
    capturing: set[int] = set()

    @contextlib.contextmanager
    def stream(s):
        current.append(s)
        try:
            yield
        finally:
            current.pop()

    monkeypatch.setattr(graphs_module, "LEASE", lease)
    monkeypatch.setattr(streams_module, "LEASE", lease)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    for module in (graphs_module, streams_module):
        monkeypatch.setattr(module, "is_capturing", lambda s: s.cuda_stream in capturing)
    return pool, lease, main, current, capturing


def test_a_steps_branches_run_every_part_in_order_and_join_even_when_one_fails(fake_cuda):
    pool, lease, main, current, _ = fake_cuda
    branches = Branches(CUDA, 6, forked=True)
    assert len(branches.streams) == MAX_BRANCHES and lease.held() == MAX_BRANCHES
    ran = []

    def part(index):
        def run():
            ran.append((index, current[-1].cuda_stream))
            return index * 10
        return run

    assert branches.run([part(i) for i in range(6)]) == [0, 10, 20, 30, 40, 50]
    lanes = {index: stream for index, stream in ran}
    assert lanes[0] == lanes[4] != lanes[1] == lanes[5]  # part i on stream i mod 4
    assert len(set(lanes.values())) == MAX_BRANCHES

    pool.log.clear()

    def fails():
        raise RuntimeError("a loss's terms failed")

    with pytest.raises(RuntimeError, match="terms failed"):
        branches.run([part(0), part(1), fails, part(3)])
    forked = [s.cuda_stream for s in branches.streams[:3]]
    joined = [other for what, stream, other in (e for e in pool.log if e[0] == "wait")
              if stream == main.cuda_stream]
    assert joined == forked  # the three forked branches joined back, the fourth never forked
    branches.close()
    assert lease.held() == 0


def test_branches_need_two_free_streams_and_run_in_turn_without_them(fake_cuda):
    _, lease, _, current, _ = fake_cuda
    lease.take(CUDA, POOL - 1)
    branches = Branches(CUDA, 5, forked=True)
    assert branches.streams == [] and lease.held() == POOL - 1
    assert branches.run([lambda i=i: (i, current[-1].cuda_stream) for i in range(3)]) == \
        [(0, 1), (1, 1), (2, 1)]


class FakeGraph:
    """``torch.cuda.CUDAGraph`` as the capture sees it; ``end_error``: what ending raises."""

    made: list = []

    def __init__(self, end_error: Exception | None = None):
        self.end_error, self.calls = end_error, []
        FakeGraph.made.append(self)

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.calls.append(("begin", capture_error_mode))

    def capture_end(self):
        self.calls.append(("end",))
        if self.end_error is not None:
            raise self.end_error

    def reset(self):
        self.calls.append(("reset",))


@pytest.fixture
def fake_graphs(fake_cuda, monkeypatch):
    abandoned = []
    FakeGraph.made = []
    ending: list = [None]
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: FakeGraph(ending[0]))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 7))
    monkeypatch.setattr(graphs_module, "_abandon_pool",
                        lambda device, pool: abandoned.append(pool))
    return fake_cuda, abandoned, ending


INVALIDATED = RuntimeError("CUDA error: operation failed due to a previous error during capture")


def test_a_failed_capture_names_its_first_cause_and_gives_everything_back(fake_graphs):
    (pool, lease, main, current, capturing), abandoned, ending = fake_graphs
    stream = lease.take(CUDA, 1)[0]
    ending[0] = INVALIDATED

    def record():
        assert current[-1] is stream
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    with pytest.raises(CaptureFailed) as failed:
        capture_graph(CUDA, stream, record)
    assert str(failed.value) == ("RuntimeError: CUDA error: operation not permitted when "
                                 "stream is capturing")
    graph = FakeGraph.made[-1]
    assert graph.calls == [("begin", "thread_local"), ("end",), ("reset",)]
    assert abandoned == [(0, 7)]  # the pool capture_end did not give back
    assert current == [main]  # the thread is back on its stream
    assert pool.log[-1] == ("synchronize", stream.cuda_stream)
    assert graphs_module._CAPTURING.acquire(blocking=False)  # the next capture may start
    graphs_module._CAPTURING.release()
    assert is_capture_error(failed.value)

    ending[0] = None  # then a capture that works: its graph, nothing abandoned
    assert capture_graph(CUDA, stream, lambda: None) is FakeGraph.made[-1]
    assert abandoned == [(0, 7)]


def test_a_failed_capture_that_leaves_a_stream_capturing_is_not_contained(fake_graphs):
    (_, lease, _, _, capturing), _, ending = fake_graphs
    stream, branch = lease.take(CUDA, 2)
    ending[0] = RuntimeError("CUDA error: capture sequence contains a fork that was not joined")
    capturing.add(branch.cuda_stream)
    with pytest.raises(StreamsLeftCapturing, match="1 stream") as left:
        capture_graph(CUDA, stream, lambda: None, joined=[branch])
    assert is_capture_error(left.value)
    streams_module.give_back([stream, branch])  # the one left capturing is never lent again
    assert branch.cuda_stream not in {s.cuda_stream for s in lease.take(CUDA, POOL)}


def test_ctrl_c_inside_a_capture_is_cleaned_up_and_passed_on(fake_graphs):
    (_, lease, main, current, _), _, ending = fake_graphs
    stream = lease.take(CUDA, 1)[0]
    ending[0] = INVALIDATED

    def record():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture_graph(CUDA, stream, record)
    assert current == [main] and FakeGraph.made[-1].calls[-1] == ("reset",)
    assert graphs_module._CAPTURING.acquire(blocking=False)
    graphs_module._CAPTURING.release()


@pytest.mark.parametrize("message, capture", [
    ("CUDA error: dependency created on uncaptured work in another stream", True),
    ("CUDA error: operation failed due to a previous error during capture", True),
    ("CUDA error: operation not permitted when stream is capturing", True),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ("the group was stopped (Ctrl-C)", False),
])
def test_errors_of_a_capture_are_told_from_others(message, capture):
    assert is_capture_error(RuntimeError(message)) is capture
    try:
        try:
            raise RuntimeError(message)
        except RuntimeError as inner:
            raise ValueError("while training a group") from inner
    except ValueError as outer:
        assert is_capture_error(outer) is capture
