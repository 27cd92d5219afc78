"""Notebook 14's exercise: a hook that overlaps, two all-reduces per bucket started in the same order on every rank.

No ``from __future__ import annotations`` here: DDP compares a hook's return annotation with
``torch.futures.Future[torch.Tensor]`` itself, and a string annotation would fail that check.

The check runs the learner's hook inside real DDP at 2, 3 and 4 ranks, on gradients made to order (each rank's
gradient is its own known vector, the exact mean is computed in float64), three buckets of odd lengths. Per world
size, in this order:

1. **A dry run**: ``torch.distributed``'s collectives replaced by stand-ins that record (name, sizes, dtype) and
   complete when the check says, for two backwards: on even ranks as soon as the hook call that started them
   returns, on odd ranks one bucket later (:class:`_DryRun`). The ranks compare what they started, in order. A
   rank that starts its collectives in another order than rank 0 is named before any real collective could pair
   one rank's first half with another's second (with odd lengths the halves differ in size, and gloo fails or
   hangs on them); so is a hook whose order depends on when collectives finish, as when the second starts in the
   first one's ``.then()`` callback (on gloo that callback runs on the backend's thread and races the next
   bucket's hook call: the lab's DESIGN notes measured PowerSGD crash so on multi-bucket models).
2. **A real run** with one rank late at each step (rank ``step % W``): it calls the hook only once every other
   rank's hook call for that bucket has *returned*, or after :data:`PATIENCE_S`. A hook that does not wait
   inside returns at once, whatever the machine's load, because starting a collective needs no peer. A hook that
   waits inside (``Work.wait()``, ``Future.wait()``, ``async_op=False``) cannot return before the late rank has
   joined its all-reduce, so the late rank's patience runs out: that is the rule for "blocking". It holds for
   every collective that needs all ranks to finish, and it does not time how long the hook took (a busy laptop
   stalls a thread for tens of milliseconds; :data:`PATIENCE_S` is far above that). The gradients DDP leaves are
   held to the exact mean, and the ranks to each other.

The hints: not attempted; ranks in different orders ("in another order"); collectives started from callbacks in an
order that depends on timing ("from .then() callbacks"); one collective per bucket ("two per bucket"); a hook that
waits ("waits inside"); right at 2 ranks only ("Right at 2 ranks"); other wrong numbers ("not the mean").
"""

import os
import shutil
import tempfile
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .checking import NOTHING_LATER, Outcome, check_function, reference

__all__ = [
    "PARAMETER_SIZES",
    "PATIENCE_S",
    "WORLD_SIZES",
    "check_overlapping_hook",
    "halves_hook",
    "halves_hook_blocking",
    "measure_overlap",
]

#: The world sizes the check tries, in this order.
WORLD_SIZES = (2, 3, 4)
#: One parameter per bucket (the buckets are capped below the smallest): odd lengths, so no two halves match.
PARAMETER_SIZES = (301, 257, 263)
#: How long the late rank waits for the others' hook calls to return before it calls them blocking.
PATIENCE_S = 2.0


# -- the reference, and its blocking twin ---------------------------------------------------------------------


@reference("halves_hook")
def halves_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket's two halves, both started here, the first half first on every rank; the Future
    joins them and divides by the group's size. Nothing here waits: backward goes on while both are sent.

    ``state``: the process group (None: the default one), as PyTorch's ``allreduce_hook`` takes it.

    Both collectives start in this call, on autograd's thread, in program order. Starting the second from the
    first's ``.then()`` callback would be a chain too, but on gloo that callback runs on the backend's thread
    when the first finishes, while autograd calls this hook for the next bucket: which all-reduce starts first
    would then depend on timing, rank by rank.
    """
    group = state if state is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    half = buffer.numel() // 2
    futures = [
        dist.all_reduce(part, group=group, async_op=True).get_future() for part in (buffer[:half], buffer[half:])
    ]

    def mean(joined):
        for future in joined.value():
            future.value()  # raises here if either all-reduce failed
        return buffer.div_(world)

    return torch.futures.collect_all(futures).then(mean)


def halves_hook_blocking(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """The same two all-reduces, each waited for inside the hook: backward stops until the bucket is sent."""
    group = state if state is not None else dist.group.WORLD
    buffer = bucket.buffer()
    half = buffer.numel() // 2
    for part in (buffer[:half], buffer[half:]):
        dist.all_reduce(part, group=group, async_op=True).wait()
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer.div_(dist.get_world_size(group)))
    return done


def measure_overlap(link: str | None = "100mbit", repeats: int = 5, cluster=None, **sizes: Any):
    """How much of each hook's communication backward hid, :func:`halves_hook` against :func:`halves_hook_blocking`,
    behind ``link``: :func:`commhooks_lab.studies.overlap.overlap_spread`'s table (median, min and max)."""
    from ..studies.overlap import overlap_spread

    hooks = {"halves, overlapping": halves_hook, "halves, blocking": halves_hook_blocking}
    return overlap_spread(hooks, link=link, repeats=repeats, cluster=cluster, **sizes)


# -- what the ranks run ----------------------------------------------------------------------------------------


class _Vectors(torch.nn.Module):
    """forward(c) = sum_i <p_i, c_i>, so each p_i's gradient is exactly c_i: the rank's own, made to order."""

    def __init__(self):
        super().__init__()
        self.vectors = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(n)) for n in PARAMETER_SIZES])

    def forward(self, cs: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * c).sum() for p, c in zip(self.vectors, cs))


def _gradients(rank: int, step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(n, generator=generator) for n in PARAMETER_SIZES]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


class _StandIn:
    """A stand-in for a ``Work``: its Future completes when the dry run says (``wait()`` completes it at once)."""

    def __init__(self, dry: "_DryRun", entry: list):
        self._dry, self._entry = dry, entry

    def wait(self, timeout: Any = None) -> bool:
        self._dry.complete([self._entry])
        self._entry[1].wait()
        return True

    def is_completed(self) -> bool:
        return self._entry[1].done()

    def is_success(self) -> bool:
        return self.is_completed()

    def result(self) -> list:
        return self._entry[2]

    def get_future(self) -> torch.futures.Future:
        return self._entry[1]


_NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter_tensor", "reduce")
#: In the dry run, nothing moving this long with collectives pending means a Future is waited on: complete them.
_UNSTICK_S = 0.1


class _DryRun:
    """Stand-in collectives that log (name, sizes, dtype, where started) and complete when this rank says.

    ``lag=False``: every collective completes as soon as the hook call that started it has returned, before the
    next bucket's hook call. ``lag=True``: one bucket later, after the next hook call has returned (all of them
    after the last bucket's). On gloo either can happen, rank by rank: a ``.then()`` callback runs on the backend's
    thread when its collective finishes. Odd ranks lag, even ranks do not, so a hook whose order of collectives
    depends on when they finish shows two orders here, every time.
    """

    def __init__(self, lag: bool):
        self.lag = lag
        self.lock = threading.RLock()
        self.pending: list[list] = []  # [generation, future, tensors]
        self.calls: list[list] = []  # per hook call: what started while it was the latest
        self.order: list[tuple] = []  # everything, in the order it started
        self.inside: int | None = None  # the thread in a hook call, while it is inside
        self.events = 0  # calls, starts and completions so far: what the watch sees move
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._unstick, daemon=True)
        self._helpers: list[threading.Thread] = []

    def __enter__(self) -> "_DryRun":
        self._watch.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._watch.join()
        self.complete()  # nothing left for a callback to start once the real collectives are back
        for helper in self._helpers:
            helper.join(timeout=5)

    def _unstick(self) -> None:
        """Something waits on a Future inside the hook or a callback when nothing moves for a while with
        collectives pending (the schedule never leaves one pending that long): complete them all, as the network
        would."""
        seen = -1
        while not self._stop.wait(_UNSTICK_S):
            with self.lock:
                stuck = self.events == seen and bool(self.pending)
                seen = self.events
            if stuck:  # on a thread of its own: a callback may wait again, and this watch must go on
                helper = threading.Thread(target=self.complete, daemon=True)
                self._helpers.append(helper)
                helper.start()

    def collective(self, name: str):
        def started(*args, **kwargs):
            tensors = _tensors(list(args) + list(kwargs.values()))
            dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else ""
            where = "hook" if self.inside == threading.get_ident() else "callback"
            record = (name, tuple(t.numel() for t in tensors), dtype, where)
            with self.lock:
                self.events += 1
                self.order.append(record)
                self.calls[-1].append(record)
            value: list = tensors[:1]  # what gloo's Future holds (torch 2.13, measured): its outputs, flat
            if name == "all_gather" and len(args) >= 2:
                for slot in args[0]:
                    slot.copy_(args[1])
                value = list(args[0])
            elif name in ("all_gather_into_tensor", "reduce_scatter_tensor") and len(args) >= 2:
                out, given = args[0], args[1].reshape(-1)
                times = max(1, -(-out.numel() // max(1, given.numel())))
                out.copy_(given.repeat(times)[: out.numel()].view_as(out))
                value = list(out.chunk(dist.get_world_size())) if name == "all_gather_into_tensor" else [out]
            if not kwargs.get("async_op"):
                return None
            entry = [len(self.calls), torch.futures.Future(), value]
            with self.lock:
                self.pending.append(entry)
            return _StandIn(self, entry)

        return started

    def complete(self, entries: list[list] | None = None, before: int | None = None) -> None:
        """Complete ``entries`` (default: all pending started before hook call ``before``, and what their callbacks
        start, until none is left). Whoever takes an entry off the list completes it, so each completes once."""
        while True:
            with self.lock:
                taken = [
                    e
                    for e in self.pending
                    if (e in entries if entries is not None else before is None or e[0] <= before)
                ]
                for e in taken:
                    self.pending.remove(e)
                self.events += len(taken)
            for _, future, tensors in taken:
                future.set_result(tensors)
            if entries is not None or not taken:
                return

    def hook(self, hook):
        def scheduled(state, bucket):
            self.calls.append([])
            self.events += 1
            self.inside = threading.get_ident()
            try:
                future = hook(state, bucket)
            finally:
                self.inside = None
                self.events += 1
            if not self.lag or bucket.is_last():
                self.complete()
            else:
                self.complete(before=len(self.calls) - 1)
            return future

        return scheduled


class _Patched:
    """``torch.distributed``'s collectives replaced while inside (in both modules, as the lab's logs do)."""

    def __init__(self, make):
        from torch.distributed import distributed_c10d

        self._modules = (dist, distributed_c10d)
        self._saved = {name: getattr(dist, name) for name in _NAMES}
        self._make = make

    def __enter__(self):
        for name, original in self._saved.items():
            for module in self._modules:
                setattr(module, name, self._make(name, original))
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            for module in self._modules:
                setattr(module, name, original)


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _backward(ddp: DDP, rank: int, step: int) -> None:
    ddp.zero_grad()
    ddp([c.clone() for c in _gradients(rank, step)]).backward()


def _dry_run(ctx, hook) -> dict:
    """Two backwards (DDP's first bucket, then its rebuilt ones) with stand-in collectives: what each hook call
    started, and everything in the order it started."""
    torch.manual_seed(0)
    ddp = DDP(_Vectors(), bucket_cap_mb=100 / 2**20)  # 100 bytes: every parameter a bucket of its own
    dry = _DryRun(lag=ctx.rank % 2 == 1)
    ddp.register_comm_hook(None, dry.hook(hook))
    try:
        with _Patched(lambda name, original: dry.collective(name)), dry:
            for step in range(2):
                _backward(ddp, ctx.rank, step)
    except NotImplementedError:
        return {"not_implemented": True}
    except Exception as exc:  # the learner's hook raised: say what, in the notebook
        return {"raised": _said(exc)}
    return {"calls": dry.calls, "order": dry.order}


def _real_run(ctx, hook, folder: str, steps: int, patience_s: float) -> dict:
    """``steps`` backwards on the real group, rank ``step % W`` late: the hook calls that did not return in time,
    and the largest error against the exact mean."""
    world, rank = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    ddp = DDP(_Vectors(), bucket_cap_mb=100 / 2**20)
    _backward(ddp, rank, 0)  # DDP's first step, with its own all-reduce: the buckets are rebuilt after it
    step_now = [0]
    waited: list[str] = []

    def judged(state, bucket):
        step, index = step_now[0], bucket.index()
        late = step % world
        if rank == late and not os.path.exists(os.path.join(folder, "blocking")):
            deadline = time.monotonic() + patience_s
            others = [os.path.join(folder, f"{step}-{index}-{r}") for r in range(world) if r != late]
            while not all(os.path.exists(p) for p in others):
                if time.monotonic() > deadline:
                    waited.append(f"step {step}, bucket {index}")
                    open(os.path.join(folder, "blocking"), "w").close()
                    break
                time.sleep(0.002)
        future = hook(state, bucket)
        if rank != late:
            open(os.path.join(folder, f"{step}-{index}-{rank}"), "w").close()
        return future

    ddp.register_comm_hook(None, judged)
    worst, last = 0.0, None
    try:
        for step in range(1, steps + 1):
            step_now[0] = step
            _backward(ddp, rank, step)
            exact = [
                torch.stack([_gradients(r, step)[i].double() for r in range(world)]).mean(0)
                for i in range(len(PARAMETER_SIZES))
            ]
            got = [p.grad.double() for p in ddp.module.vectors]
            error = max(float((g - e).abs().max() / e.abs().max()) for g, e in zip(got, exact))
            worst = max(worst, error)
            last = torch.cat([g.float() for g in got])
    except NotImplementedError:
        return {"not_implemented": True}
    except Exception as exc:
        return {"raised": _said(exc)}
    return {"waited": waited, "worst_rel_error": worst, "last": last}


def _check_job(ctx, hook, folder: str, steps: int, patience_s: float) -> dict:
    """On every rank: the dry run, its lists compared across ranks, then (if they agree) the real run."""
    dry = _dry_run(ctx, hook)
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, dry)
    if any("order" not in d for d in everyone) or any(_sent(d) != _sent(everyone[0]) for d in everyone):
        return {"dry": everyone}
    return {"dry": everyone, "real": _real_run(ctx, hook, folder, steps, patience_s)}


# -- the check -------------------------------------------------------------------------------------------------


def _sent(dry: dict) -> list[tuple]:
    """What a rank's dry run started, in order: (name, sizes, dtype), without where it was started from."""
    return [record[:3] for record in dry["order"]]


def _described(records: list[tuple]) -> str:
    return ", ".join(f"{name} of {'+'.join(map(str, sizes))} {dtype}" for name, sizes, dtype, *_ in records)


def _order_problem(dry: list[dict]) -> str | None:
    """The first rank whose collectives differ from rank 0's, said with both lists from where they part."""
    first = _sent(dry[0])
    for rank, got in enumerate(dry[1:], start=1):
        mine = _sent(got)
        if mine == first:
            continue
        at = next((i for i, (a, b) in enumerate(zip(mine, first)) if a != b), min(len(mine), len(first)))
        ours, theirs = (_described(records[at : at + 3]) or "nothing" for records in (first, mine))
        lists = f"rank 0: {ours}; rank {rank}: {theirs}"
        if any(where == "callback" for *_, where in dry[0]["order"]):
            return (
                f"your hook starts collectives from .then() callbacks, and their order then depends on when each "
                f"collective finishes ({lists}, from the collective numbered {at} on; here rank 0 finished each "
                "bucket's collectives before the next bucket's hook call, rank 1 one bucket later). On gloo a callback "
                "runs on "
                "the backend's thread when its collective finishes, while autograd calls your hook for the next "
                "bucket: ranks then start their collectives in different orders, and gloo fails ('Received data "
                "size doesn't match expected size') or sums the wrong halves. Start both collectives in the hook "
                "call itself and join their futures (torch.futures.collect_all)."
            )
        return (
            f"rank {rank} starts other collectives, or in another order, than rank 0 ({lists}, from the collective "
            f"numbered {at} on). Collectives pair up by the order they start in, so every rank must start the same "
            "ones in the same order: nothing in which comes first may depend on the rank."
        )
    return None


def _problem_at(results: list[dict], world: int) -> str | None:
    """What is wrong with the hook at ``world`` ranks, from every rank's result, or None."""
    dry = results[0]["dry"]
    for got in dry:
        if got.get("not_implemented"):
            raise NotImplementedError
        if "raised" in got:
            return f"Inside DDP your hook raised {got['raised']}"
    problem = _order_problem(dry)
    if problem is not None:
        return problem
    first = dry[0]["calls"]
    few = [c for c in first if len(c) < 2]
    if few:
        return (
            f"your hook starts {len(few[0])} collective(s) for a bucket: the exercise asks for two per bucket (its two "
            "halves), each started asynchronously, joined in the Future you return."
        )
    real = [r["real"] for r in results]
    for got in real:
        if got.get("not_implemented"):
            raise NotImplementedError
        if "raised" in got:
            return f"Inside DDP your hook raised {got['raised']}"
    waited = [w for got in real for w in got["waited"]]
    if waited:
        return (
            f"your hook waits inside: with one rank late ({waited[0]}), the others' hook calls did not return until it "
            f"joined (it waited {PATIENCE_S:g} s for them). A Work.wait(), Future.wait() or async_op=False holds "
            "backward until the bucket is sent; start the collectives with async_op=True and return a Future chained "
            "with .then() (or torch.futures.collect_all) that finishes the bucket when they complete."
        )
    if any(not torch.equal(got["last"], real[0]["last"]) for got in real[1:]):
        return "the ranks ended with different gradients: every rank must do the same arithmetic on the same sums."
    worst = max(got["worst_rel_error"] for got in real)
    if worst > 1e-5:
        return (
            f"the gradients DDP left are not the mean over the {world} ranks (largest error {worst:.2g} of the "
            "largest entry): sum each half over the group and divide by the group's size, dist.get_world_size(group)."
        )
    return None


def _run_at(hook, world: int, given: list, steps: int) -> list[dict]:
    from ..launcher import launch

    folder = tempfile.mkdtemp(prefix="commhooks-overlap-")
    try:
        cluster = next((c for c in given if c.world_size == world), None)
        args = (hook, folder, steps, PATIENCE_S)
        if cluster is not None:
            return cluster.run(_check_job, *args, timeout_s=60)
        return launch(_check_job, *args, world_size=world, timeout_s=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _verify(hook, cluster, world_sizes) -> str | None:
    given = [c for c in (cluster if isinstance(cluster, list | tuple) else [cluster]) if c is not None]
    right_at: list[int] = []
    for world in world_sizes:
        problem = _problem_at(_run_at(hook, world, given, steps=world), world)
        if problem is None:
            right_at.append(world)
            continue
        if right_at == [2]:
            return (
                f"Right at 2 ranks, but at {world}: {problem} Something in your hook holds only for two ranks: a 2 "
                "for the world size, or rank 1 as 'the other' rank."
            )
        return f"At {world} ranks: {problem}"
    return None


def check_overlapping_hook(attempt, cluster=None, world_sizes=WORLD_SIZES) -> Outcome:
    """Your hook inside DDP at 2, 3 and 4 ranks: two collectives per bucket, started in the same order on every
    rank, none waited for inside the hook, the exact mean in every bucket.

    ``cluster``: a Cluster, or several, used for the world sizes they have; the others get fresh ranks.

    Wrong answers it recognises, each told by its own hint: ranks that start their collectives in different orders
    ("in another order, than rank 0"); a second collective started from the first one's ``.then()`` callback,
    whose order then depends on timing ("from .then() callbacks"; one queue through every bucket's collectives
    passes); one collective per bucket ("two per bucket"); a hook that waits inside ("waits inside"); a hook right
    at 2 ranks only ("Right at 2 ranks"); ranks that disagree ("different gradients"); other wrong sums ("not the
    mean"); a hook that raises ("Inside DDP your hook raised").
    """
    return check_function(
        "halves_hook",
        attempt,
        lambda fn: _verify(fn, cluster, world_sizes),
        f"At {', '.join(map(str, world_sizes))} ranks: two collectives per bucket in the same order on every rank, "
        "none waited for inside the hook (the others returned before a late rank joined), the exact mean.",
        later=NOTHING_LATER,
    )
