"""The copy stream and events of reft.torch's snapshot path, behind one small
interface with two implementations:

- CudaStreams: a dedicated CUDA copy stream. record() records an event on
  the compute stream (the current stream of the device); copy() makes the
  copy stream wait for it, issues the device-to-host copies and records a
  done event; fence() makes the compute stream wait for that event (a
  GPU-side wait, no host synchronisation); synchronize() waits on the host
  for it (torch releases the GIL there).
- CpuStreams: the same semantics on the host, so that CPU tensors take the
  same code path. CPU tensor operations run synchronously on the thread that
  calls them, so the compute stream is the training thread: an event
  recorded on it is complete at once, and fence() must wait on the host
  (the one place where a host wait stands in for a GPU-side one). The copy
  stream is one worker thread that runs the copies in order; torch's CPU
  copy releases the GIL, so training goes on while it copies.

A copy job is (source, offset, size, destination): ``size`` bytes from byte
``offset`` of ``source`` (a flat uint8 tensor) to ``destination`` (a uint8
CPU tensor of ``size`` bytes in an arena). ``source`` may also be a
callable returning that tensor: it is called on the copy stream (after the
recorded event), which is where a non-contiguous tensor is gathered into a
contiguous temporary.

Imported by reft.torch only (it needs torch)."""

import queue
import threading
import warnings

import torch

from ._errors import Error


class _CpuEvent:
    """A host event: set once, with the failure that ended the work, if any."""

    __slots__ = ("_done", "error")

    def __init__(self, done=False):
        self._done = threading.Event()
        self.error = None
        if done:
            self._done.set()

    def query(self):
        return self._done.is_set()

    def set(self, error=None):
        self.error = error
        self._done.set()

    def wait(self, timeout=None):
        return self._done.wait(timeout)


_foreach = [getattr(torch, "_foreach_copy_", None)]  # torch >= 2.1: one call for all copies


def _copy_all(dsts, srcs, non_blocking):
    f = _foreach[0]
    if f is not None and len(dsts) > 1:
        try:
            f(dsts, srcs, non_blocking=non_blocking)
            return
        except (RuntimeError, TypeError) as e:
            # Same copies one call each: slower to issue, same result.
            _foreach[0] = None
            warnings.warn("reft.torch: torch._foreach_copy_ refused the snapshot copies (%s); "
                          "issuing them one copy_ call each from now on" % e, RuntimeWarning)
    for d, s in zip(dsts, srcs):
        d.copy_(s, non_blocking=non_blocking)


def _run_jobs(jobs, non_blocking):
    gathered = {}
    dsts, srcs = [], []
    for src, off, size, dst in jobs:
        if callable(src):
            key = id(src)
            if key not in gathered:
                gathered[key] = (src, src())  # the callable is kept alive with its result
            src = gathered[key][1]
        srcs.append(src[off:off + size])
        dsts.append(dst)
    _copy_all(dsts, srcs, non_blocking)
    return gathered


class CpuStreams:
    """CPU twin of CudaStreams (see the module docstring). ``before_copy``,
    when given, is called on the copy thread before each job with the job's
    index (tests use it to hold a copy or make it fail)."""

    kind = "cpu"

    def __init__(self, before_copy=None):
        self._before = before_copy
        self._q = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()

    def _worker(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            after, jobs, done = item
            after.wait()
            err = after.error
            if err is None:
                try:
                    for i, job in enumerate(jobs):
                        if self._before is not None:
                            self._before(i)
                        _run_jobs([job], False)
                except BaseException as e:  # noqa: BLE001 - reported through the event
                    err = e
            done.set(err)

    def record(self):
        # CPU work is done when the call that queued it returns.
        return _CpuEvent(done=True)

    def copy(self, after, jobs):
        done = _CpuEvent()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="reft-cpu-copy-stream",
                                                daemon=True)
                self._thread.start()
        self._q.put((after, list(jobs), done))
        return done

    def fence(self, done):
        done.wait()  # a host wait: the CPU "compute stream" is this thread

    def synchronize(self, done):
        done.wait()
        if done.error is not None:
            e = done.error
            if isinstance(e, Error):
                raise e
            raise Error("the copy into the arena failed: %r" % (e,)) from e

    def query(self, done):
        return done.query()

    def close(self):
        with self._lock:
            if self._thread is not None:
                self._q.put(None)
                self._thread = None


class CudaStreams:
    """The CUDA copy stream of one device (see the module docstring)."""

    kind = "cuda"

    def __init__(self, device, timing=False):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        # timing: done events carry .reft_start, for done.reft_start.elapsed_time(done)
        # (the copy's own time on the copy stream; tests/gpu measures bandwidth with it).
        self.timing = timing

    def record(self):
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def copy(self, after, jobs):
        done = torch.cuda.Event(enable_timing=self.timing)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self.stream.wait_event(after)
            if self.timing:
                done.reft_start = torch.cuda.Event(enable_timing=True)
                done.reft_start.record(self.stream)
            # The sources are referenced by the caller until synchronize()
            # has returned, so the caching allocator cannot hand their
            # memory out mid-copy; a gathered temporary is allocated on the
            # copy stream and kept (in gathered) until then too.
            gathered = _run_jobs(jobs, True)
            done.record(self.stream)
        done._reft_keep = gathered  # noqa: SLF001 - freed with the event
        return done

    def fence(self, done):
        torch.cuda.current_stream(self.device).wait_event(done)

    def synchronize(self, done):
        try:
            done.synchronize()  # releases the GIL
        except RuntimeError as e:
            raise Error("the device-to-host copy into the arena failed: %s" % e) from e
        done._reft_keep = None

    def query(self, done):
        return done.query()

    def close(self):
        pass
