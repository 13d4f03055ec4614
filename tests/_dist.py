"""Runs a function in several processes with torch.distributed set up on the
tpu backend, bounded in time: a process that hangs is killed and the test
fails, naming what it waited for. Used by the distributed tests."""

import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank, fn, world, port, backend, timeout_s, out_dir, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.setdefault("TORCHTPU_CACHE_DIR", "")
    import torch.distributed as dist

    import torchtpu  # noqa: F401

    try:
        kw = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if backend is not None:
            kw["backend"] = backend
        dist.init_process_group(rank=rank, world_size=world, **kw)
        result = fn(rank, world, *args)
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"error{rank}"), "w") as f:
            f.write(traceback.format_exc())
        raise
    with open(os.path.join(out_dir, f"result{rank}"), "wb") as f:
        pickle.dump(result, f)


def run(fn, world=2, args=(), backend=None, collective_timeout_s=60, timeout_s=240, may_exit=()):
    """fn(rank, world, *args) in `world` processes, each with
    init_process_group(backend, timeout=collective_timeout_s) done; returns
    the list of what each returned (picklable; None for the ranks in
    may_exit, which may end their process early). Raises AssertionError with
    the ranks' errors, or when the run exceeds timeout_s (the processes are
    killed)."""
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(
            _child,
            args=(fn, world, free_port(), backend, collective_timeout_s, out, args),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            for p in ctx.processes:
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    raise AssertionError(f"distributed run of {fn.__name__} exceeded {timeout_s} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        errs = [open(os.path.join(out, f)).read() for f in sorted(os.listdir(out)) if f.startswith("error")]
        if errs:
            raise AssertionError("\n".join(errs))
        results = []
        for r, p in enumerate(ctx.processes):
            path = os.path.join(out, f"result{r}")
            if r in may_exit:
                results.append(None)
                continue
            if p.exitcode != 0 or not os.path.exists(path):
                raise AssertionError(f"rank {r} of {fn.__name__} ended with exit code {p.exitcode}")
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        return results
