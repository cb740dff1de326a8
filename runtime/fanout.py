"""Jobs over worker processes (spawned: each builds Triton kernels of its own): all at once, or
yielded in order as each is ready, the caller working meanwhile."""
from __future__ import annotations


def fan_out(fn, jobs: list, processes: int) -> list:
    """``[fn(job) for job in jobs]``, in ``processes`` worker processes when more than one."""
    if processes <= 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(processes, len(jobs)), mp_context=ctx) as pool:
        return list(pool.map(fn, jobs))


def fan_out_lazy(fn, jobs: list, processes: int):
    """``fn(job)`` for each job, yielded in order as each is ready while the rest go on in
    ``processes`` worker processes (at a lower priority than the caller, which times kernels
    meanwhile); those not yet started are dropped if the caller stops early."""
    if processes <= 1 or len(jobs) <= 1:
        yield from map(fn, jobs)
        return
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(min(processes, len(jobs)), mp_context=ctx, initializer=os.nice,
                               initargs=(10,))
    try:
        yield from pool.map(fn, jobs)
    finally:
        pool.shutdown(cancel_futures=True)
