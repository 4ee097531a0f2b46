"""Executors: run a batch of independent calls `fn(*args)` and report each result as it lands.

Three kinds, one interface (`Executor.map`):

- `SerialExecutor`: in this process, in the order given; nothing is started. The default of every
  command but `plan`, and what `--ray` and `--workers` absent mean: exactly the behaviour before
  executors existed.
- `ProcessExecutor` (`--workers N` without `--ray`): N processes of this host (forkserver, started on
  the first batch of more than one call, kept for the command's life), results in the order they finish.
- `RayExecutor` (deploy/ray/pool.py, imported only when `--ray` is given): each call a Ray task
  (one CPU each), results reported in the order they finish.

`fn` must be a module-level function (a Ray worker or a process imports it by name) whose result depends on
its arguments only: the simulator is deterministic, so where a call runs never changes a number.
`open_executor(address)` is the one way the CLI gets an executor; it keeps Ray out of the import
graph of the single-host commands.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Protocol, Sequence

OnDone = Callable[[int, Any], None]  # (index into the batch, result)


class Executor(Protocol):
    parallel: bool  # False: map runs the calls one after another in this process
    num_workers: int  # calls that may run at once

    def map(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], on_done: OnDone) -> None:
        """Run `fn(*a)` for every `a` in `args`; `on_done(i, result)` once per call, in the caller's
        thread, as each finishes. A call that raises stops the batch and the exception propagates."""
        ...

    def starting(self) -> None:
        """Work begins: a batch goes out, or a caller runs a simulation itself (experiments/simrun.py)."""
        ...


class SerialExecutor:
    parallel = False
    num_workers = 1

    def map(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], on_done: OnDone) -> None:
        for i, a in enumerate(args):
            on_done(i, fn(*a))

    def starting(self) -> None:
        pass


class ProcessExecutor:
    parallel = True

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._pool: Any = None

    def map(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], on_done: OnDone) -> None:
        if len(args) <= 1:  # nothing to overlap: no process to start
            return SerialExecutor().map(fn, args, on_done)
        from concurrent.futures import as_completed

        pool = self._open()
        futures = {pool.submit(fn, *a): i for i, a in enumerate(args)}
        try:
            for f in as_completed(futures):
                on_done(futures[f], f.result())
        finally:  # an error or Ctrl-C: the rest of the batch is not wanted
            for f in futures:
                f.cancel()

    def starting(self) -> None:
        pass

    def _open(self) -> Any:
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context("forkserver"))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class Announcing:
    """An executor that calls `announce()` once, when work first begins (`starting`: the CLI's line
    saying which build of the simulator runs, after every input was checked, before any work)."""

    def __init__(self, inner: Executor, announce: Callable[[], None]) -> None:
        self.inner = inner
        self.parallel = inner.parallel
        self.num_workers = inner.num_workers
        self._announce: Callable[[], None] | None = announce

    def map(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], on_done: OnDone) -> None:
        self.starting()
        self.inner.map(fn, args, on_done)

    def starting(self) -> None:
        if self._announce is not None:
            announce, self._announce = self._announce, None
            announce()


@contextlib.contextmanager
def open_executor(ray_address: str | None, num_workers: int | None = None,
                  identity: Callable[[], str] | None = None,
                  announce: Callable[[], None] | None = None) -> Iterator[Executor]:
    """No address: the serial executor, or with `num_workers` > 1 that many processes of this host.
    An address: a Ray session for the block (deploy/ray/pool.py: `local` starts a local cluster of
    `num_workers` CPUs and stops it on exit, `auto` or HOST:PORT joins a running one); an unusable
    address or a missing Ray raises InputError before anything starts. `identity` (e.g. the
    simulator's code fingerprint) must be the same in every worker; `announce` is called once
    before the first batch (`Announcing`)."""
    with _open(ray_address, num_workers, identity) as executor:
        yield executor if announce is None else Announcing(executor, announce)


@contextlib.contextmanager
def _open(ray_address: str | None, num_workers: int | None,
          identity: Callable[[], str] | None) -> Iterator[Executor]:
    if ray_address is None:
        if num_workers is not None and num_workers < 1:
            from ..errors import InputError

            raise InputError(f"--workers must be at least 1, got {num_workers}")
        if num_workers is None or num_workers == 1:
            yield SerialExecutor()
            return
        executor = ProcessExecutor(num_workers)
        try:
            yield executor
        finally:
            executor.close()
        return
    from ..deploy.ray.pool import ray_session

    with ray_session(ray_address, num_workers, *(() if identity is None else (identity,))) as executor:
        yield executor
