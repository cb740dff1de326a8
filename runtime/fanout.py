"""Jobs over worker processes (spawned: each builds Triton kernels of its own): all at once, or
asked one by one of a pool while the caller works."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager


def fan_out(fn, jobs: list, processes: int, done=None) -> list:
    """``[fn(job) for job in jobs]``, in ``processes`` worker processes (``worker_pool``) when
    more than one; ``done()`` (if given) as each result comes, in order."""
    def each(results):
        for result in results:
            if done:
                done()
            yield result
    if processes <= 1 or len(jobs) <= 1:
        return list(each(fn(job) for job in jobs))
    with worker_pool(min(processes, len(jobs))) as pool:
        return list(each(pool.map(fn, jobs)))


class Inline:
    """``submit`` runs the job here, at once (one process)."""

    def submit(self, fn, *args) -> Future:
        done = Future()
        try:
            done.set_result(fn(*args))
        except Exception as err:  # handed to whoever asks for the result, as a pool would
            done.set_exception(err)
        return done


@contextmanager
def worker_pool(processes: int):
    """An executor (``submit(fn, *args) -> Future``) of ``processes`` worker processes at a lower
    priority than the caller, which works meanwhile (times kernels); jobs not yet started when
    the block ends are dropped. One process: ``Inline``."""
    if processes <= 1:
        yield Inline()
        return
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(processes, mp_context=ctx, initializer=os.nice, initargs=(10,))
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)
