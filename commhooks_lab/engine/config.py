"""One experiment, described as data: which hook, on which task, with how many ranks.

Like Accelerate's ``DistributedDataParallelKwargs``: a dataclass whose values are names users
already know (Accelerate's hook enum members are accepted too). ``check()`` refuses bad
values before any process starts.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..hooks import registry
from ..hooks.choice import HookChoice, check_hook_choice, split_spec
from ..launcher.link_spec import payload_share
from ..launcher.options import DEFAULT_TIMEOUT_S, check_common_options
from ..launcher.rank_spec import RankSpec
from .fsdp2_comm_spec import check_fsdp2_comm, run_name
from .models import TASKS, effective_seed, resolve_task_factory

__all__ = ["COMPILE_BACKEND", "COMPILE_MODES", "ExperimentConfig", "fsdp2_hooks"]

OPTIMIZERS = ("sgd", "momentum", "adam")
APIS = ("torch", "accelerate", "fsdp2")
#: How a run's DDP step is compiled: not at all; torch.compile with Dynamo's DDPOptimizer (the reducer
#: and its hook run as in eager); torch.compile with compiled autograd and the python reducer.
COMPILE_MODES = ("eager", "ddp_optimizer", "compiled_autograd")
#: The compile backend: aot_eager traces like inductor does but builds no C++ (seconds on a laptop).
COMPILE_BACKEND = "aot_eager"


#: Seeds reach torch's and numpy's generators (numpy's take 32 bits); a seed set adds 1000 per set.
MAX_SEED = 2**32 - 1 - 1000 * 100
#: A lab run is minutes of steps; a larger number is a typo (and would overflow counters in the ranks).
MAX_STEPS = 10**7
#: More than this is no bucket a laptop holds (DDP multiplies it by 2**20 into an int).
MAX_BUCKET_CAP_MB = 1024.0**2
#: The optimizers take lr into float32 tensor arithmetic, Adam as lr / (1 - 0.9) at its first step: above about
#: 3.4e38 / 10 a rank fails with "value cannot be converted to type float without overflow". 1e30 leaves room.
MAX_LR = 1e30
#: The fields that hold whole numbers and real numbers: a numpy scalar (``for seed in np.arange(3)``) is taken
#: as the Python number it is, which torch, random and json all accept.
_INT_FIELDS = ("world_size", "nodes", "steps", "batch_size", "seed", "eval_every", "checkpoint_at")
_REAL_FIELDS = ("lr", "bucket_cap_mb", "timeout_s")


def _positive(name: str, value, kind=numbers.Real, most: float = math.inf) -> None:
    """``value`` of ``kind``, finite, > 0 and at most ``most`` (a NaN or an infinity is refused here, not in a rank)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or not (isinstance(value, numbers.Integral) or math.isfinite(value))
        or not 0 < value <= most
    ):
        limit = "" if most == math.inf else f", at most {most:g}"
        raise ValueError(
            f"{name} must be a {'positive int' if kind is numbers.Integral else 'finite number > 0'}{limit}, "
            f"got {value!r}"
        )


def _non_negative_int(name: str, value, hint: str = "", most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= (most or math.inf):
        limit = f" and <= {most}" if most else ""
        raise ValueError(f"{name} must be an int >= 0{limit}{hint}, got {value!r}")


@dataclass
class ExperimentConfig:
    """Everything one run needs. The same config and seed give bit-identical numbers."""

    hook: Any = "allreduce"  # a name, an Accelerate DDPCommunicationHookType, a callable, "module:function"
    wrapper: Any = "no"  # "no" | "fp16" | "bf16"
    state_options: dict = field(default_factory=dict)  # PowerSGDState keyword arguments
    state_factory: Callable | None = None  # your hook's state: factory(process_group, **state_options)
    model: Any = "mlp"  # "mlp" | "cnn" | "lowrank" | factory(seed) -> Task | "module:function"
    world_size: int = 2
    steps: int = 20
    batch_size: int = 32  # per rank
    optimizer: str = "momentum"  # "sgd" | "momentum" (0.9) | "adam"
    lr: float = 0.1
    seed: int = 0
    bucket_cap_mb: float = 25.0
    measure: bool = True  # False: bytes and loss only, no float64 error measurement (the hook is still wrapped)
    eval_every: int = 0  # test accuracy every k steps (0: at the end only)
    sample_layer: str | None = None  # whose element-wise gradients to keep (default: the largest matrix)
    api: str = "torch"  # "torch": register_comm_hook; "accelerate": DistributedDataParallelKwargs
    compile: str = "eager"  # "eager" | "ddp_optimizer" | "compiled_autograd": torch.compile (aot_eager) modes
    backend: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S  # seconds without progress before the run is called hung
    label: str | None = None  # a name for tables and legends
    checkpoint_at: int | None = None  # after this many steps save model, optimizer and hook state, then go on
    checkpoint_dir: str | None = None  # where: one folder per checkpoint (files per rank, run.json)
    resume_from: str | None = None  # a checkpoint_dir: start new ranks at its step
    resume_hook_state: bool = True  # False: restore everything but the hook's memory (what a plain resume does)
    live: bool = False  # measure each step as it ends and send its row to the notebook (the dashboard's curves)
    link: str | None = None  # every rank behind a link of its own: "100mbit", "1gbit", "unlimited"; None: loopback
    nodes: int = 1  # 2 or more: ranks grouped into nodes, link= is then each node's one uplink (launcher.topology)
    intra_link: str | None = None  # with nodes=: each rank's link inside its node (None: no limit)
    timing: bool = False  # time DDP's own overlap: the hook runs as registered, unprobed (needs measure=False)
    fsdp2_comm: str | None = None  # api='fsdp2': what moves the gradients (engine.fsdp2_comm_spec); None: PyTorch's

    def __post_init__(self) -> None:
        self.hook, self.state_options = split_spec(self.hook, self.state_options)  # "topk[ratio=0.05]"
        _as_python_numbers(self)
        for name in ("checkpoint_dir", "resume_from"):
            if getattr(self, name) is not None:
                setattr(self, name, os.fspath(getattr(self, name)))

    def check(self, local: bool = True) -> HookChoice:
        """Validate everything; return the checked hook choice.

        ``local=False`` when the ranks are given (torchrun, accelerate launch, inside a rank):
        this machine's limits (how many ranks, a GPU per rank here) are then not the lab's to check.
        """
        return self.checked(local)[0]

    def rank_spec(self) -> RankSpec:
        """The ranks this run needs on this machine, checked (:class:`~commhooks_lab.launcher.RankSpec`)."""
        return RankSpec(
            self.world_size, self.backend, self.timeout_s, self.link, nodes=self.nodes, intra_link=self.intra_link
        )

    def checked(self, local: bool = True) -> tuple[HookChoice, RankSpec | None]:
        """:meth:`check`, and the ranks the run needs (made once, here; None when ``local=False``)."""
        spec = None
        if not isinstance(self.state_options, dict) or not all(isinstance(k, str) for k in self.state_options):
            raise TypeError(
                "state_options must be a dict of option names to values, e.g. {'matrix_approximation_rank': 2}, "
                f"got {self.state_options!r}"
            )
        choice = check_hook_choice(self.hook, self.wrapper, self.state_options, self.state_factory, self.api)
        resolve_task_factory(self.model)
        effective_seed(0)  # a bad COMMHOOKS_LAB_SEED_SET is refused here, not in every rank after they start
        if local:
            spec = self.rank_spec()
            _check_link_carries_the_model(self, spec)
        else:
            check_common_options(self.world_size, self.backend, self.timeout_s)
            for name in ("link", "intra_link"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} shapes the links of ranks the lab starts; under torchrun or "
                        f"accelerate launch the ranks' network is the real one: drop {name}="
                    )
            if self.nodes != 1:
                raise ValueError(
                    f"nodes={self.nodes!r} groups ranks the lab starts; under torchrun or accelerate launch the nodes "
                    "are the real ones (torchrun's --nnodes): drop nodes="
                )
        _check_timing(self)
        _positive("steps", self.steps, numbers.Integral, most=MAX_STEPS)
        _positive("batch_size", self.batch_size, numbers.Integral, most=MAX_STEPS)
        _positive("lr", self.lr, most=MAX_LR)
        if self.label is not None and not isinstance(self.label, str):
            raise TypeError(f"label must be a string (it names the run in tables and files), got {self.label!r}")
        _positive("bucket_cap_mb", self.bucket_cap_mb, most=MAX_BUCKET_CAP_MB)
        _non_negative_int("seed", self.seed, most=MAX_SEED)
        _non_negative_int("eval_every", self.eval_every, " (0: evaluate at the end only)")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        if self.api not in APIS:
            raise ValueError(
                f"unknown api {self.api!r}; choose 'torch' (register_comm_hook), 'accelerate' "
                "(DistributedDataParallelKwargs) or 'fsdp2' (fully_shard, reduce_dtype named by the hook)"
            )
        if self.api == "accelerate":
            _check_accelerate(choice)
        if self.api == "fsdp2":
            _check_fsdp2(choice)
        check_fsdp2_comm(
            self.fsdp2_comm, self.api, getattr(choice.entry, "fsdp2_reduce_dtype", None), self.world_size, self.nodes
        )
        _check_compile(self, choice)
        self._check_checkpointing(choice)
        return choice, spec

    def _check_checkpointing(self, choice: HookChoice) -> None:
        if self.checkpoint_at is None and self.resume_from is None:
            return
        if self.api != "torch":
            raise ValueError(
                f"checkpoint_at / resume_from work with api='torch' (register_comm_hook), not api={self.api!r}: "
                "the lab reaches the hook state only through the state it registered itself"
            )
        if choice.entry is not None and choice.entry.step_post_hook is not None:
            raise ValueError(
                f"checkpoint_at / resume_from do not save the outer state {choice.entry.name} keeps in its optimizer "
                "step hook (for DiLoCo, the global parameters and outer optimizer) yet: run it without them"
            )
        if self.checkpoint_at is not None:
            _positive("checkpoint_at", self.checkpoint_at, numbers.Integral)
            if self.checkpoint_at > self.steps:
                raise ValueError(f"checkpoint_at={self.checkpoint_at} is after the last step (steps={self.steps})")
            if not self.checkpoint_dir:
                raise ValueError("checkpoint_at needs checkpoint_dir: a folder the ranks can write")
            from .checkpoint import private_folder

            private_folder(self.checkpoint_dir)  # refused now if another account could replace its files
            if self.resume_from is not None and os.path.realpath(self.resume_from) == os.path.realpath(
                self.checkpoint_dir
            ):
                raise ValueError("checkpoint_dir must differ from resume_from: it would overwrite the one being read")
        if self.resume_from is not None:
            from .checkpoint import check_resume

            meta = check_resume(self.to_dict(), self.resume_from)
            if self.checkpoint_at is not None and self.checkpoint_at <= meta["step"]:
                raise ValueError(f"checkpoint_at={self.checkpoint_at} is not after the resumed step {meta['step']}")

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        hook = check_hook_choice(self.hook, self.wrapper, self.state_options, self.state_factory).name
        return run_name(hook, self.fsdp2_comm)

    def replace(self, **changes) -> ExperimentConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-safe: callables become their qualified names."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            value = getattr(value, "value", value)  # enum members
            if hasattr(value, "encode") and hasattr(value, "decode"):  # a compressor
                value = f"compressor:{value.name}"
            elif callable(value):
                value = f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"
            out[f.name] = value
        return out


def _check_link_carries_the_model(config: ExperimentConfig, spec: RankSpec) -> None:
    """Refuse a link too slow to send the model once within timeout_s: DDP's first act (``_sync_module_states``)
    broadcasts rank 0's parameters and buffers to every other rank in one gloo operation, and gloo gives up after
    timeout_s with only "Timed out waiting ... for send operation". The estimate is a floor (rate and headers
    alone), so a run it refuses would surely fail; only the lab's own models are built here to count their bytes.
    On nodes, the copies for the other nodes' ranks all leave through node 0's uplink."""
    link, topology = spec.link, spec.topology
    if link is None or link.rate_bits is None or config.model not in TASKS:
        return
    model = resolve_task_factory(config.model)(0).model
    tensors = [*model.parameters(), *model.buffers()]
    model_bytes = sum(t.numel() * t.element_size() for t in tensors)
    copies = config.world_size - (1 if topology is None else topology.ranks_per_node)
    seconds = 8 * model_bytes * copies / (link.rate_bits * payload_share())
    whom, way = f"the other {copies} rank(s)", "rank 0's link"
    if topology is not None:
        whom, way = f"the {copies} rank(s) on other nodes", "node 0's uplink"
    if seconds > config.timeout_s:
        raise ValueError(
            f"link={link.spec!r} is too slow for model={config.model!r}: DDP first sends rank 0's {model_bytes:,} "
            f"bytes of parameters to {whom}, at least {seconds:.0f} s through {way}, and gloo gives up "
            f"after timeout_s={config.timeout_s:g} s. Use a faster link, a smaller model, or "
            f"timeout_s={math.ceil(2 * seconds)}"
        )


def _as_python_numbers(config: ExperimentConfig) -> None:
    """numpy integer and float scalars in the numeric fields become Python ints and floats (bools stay refused)."""
    for name in _INT_FIELDS + _REAL_FIELDS:
        value = getattr(config, name)
        if isinstance(value, bool) or type(value) in (int, float):
            continue
        if isinstance(value, numbers.Integral):
            setattr(config, name, int(value))
        elif name in _REAL_FIELDS and isinstance(value, numbers.Real):
            setattr(config, name, float(value))


def fsdp2_hooks() -> list[str]:
    """The hook names api='fsdp2' maps to a reduce_dtype (``HookEntry.fsdp2_reduce_dtype``)."""
    return [e.name for e in registry.entries(registry.HOOK) if e.fsdp2_reduce_dtype is not None]


def _check_timing(config: ExperimentConfig) -> None:
    if not isinstance(config.timing, bool):
        raise TypeError(f"timing must be True or False, got {config.timing!r}")
    if config.timing and config.measure:
        raise ValueError(
            "timing=True times the step as DDP runs it, with each bucket's communication overlapping backward; "
            "the probe's float64 measurement copies every gradient inside the hook and waits for each bucket, "
            "which changes that time: pass measure=False with timing=True (bytes and loss still come back)"
        )
    if config.timing and config.api != "torch":
        raise ValueError(f"timing=True runs with api='torch' (register_comm_hook), not api={config.api!r}")


def _check_compile(config: ExperimentConfig, choice: HookChoice) -> None:
    if config.compile not in COMPILE_MODES:
        raise ValueError(f"unknown compile {config.compile!r}; choose one of {list(COMPILE_MODES)}")
    if config.compile == "eager":
        return
    if config.api != "torch" or config.checkpoint_at is not None or config.resume_from is not None:
        raise ValueError(
            f"compile={config.compile!r} runs with api='torch' and without checkpoint_at / resume_from "
            "(the lab compiles only the plain register_comm_hook path)"
        )
    if config.compile != "compiled_autograd":
        return
    for entry in (choice.wrapper_entry, choice.entry):  # the wrapper is called first, so it fails first
        if entry is not None and entry.not_compilable:
            raise ValueError(f"{choice.name} cannot run under compiled autograd: {entry.not_compilable}")
    if config.measure:
        raise ValueError(
            "compile='compiled_autograd' needs measure=False: the probe measures whole buckets, and under "
            "compiled autograd DDP hands the hook one (param.grad, param) at a time; loss and accuracy still come back"
        )


def _check_fsdp2(choice: HookChoice) -> None:
    if choice.entry is None or choice.entry.fsdp2_reduce_dtype is None or choice.wrapper != "no" or choice.options:
        raise ValueError(
            f"api='fsdp2' takes hook in {fsdp2_hooks()}: the dtype FSDP2 reduces gradients in "
            f"(MixedPrecisionPolicy(reduce_dtype=...)), no wrapper and no state_options; got {choice.name}"
        )


def _check_accelerate(choice: HookChoice) -> None:
    if choice.entry is None or choice.entry.accelerate is None:
        named = [e.name for e in registry.entries(registry.HOOK) if e.accelerate is not None]
        raise ValueError(
            f"api='accelerate' takes the hooks Accelerate's DDPCommunicationHookType names, "
            f"{named}; {choice.name} has no Accelerate form (use api='torch')"
        )
    try:
        import accelerate  # noqa: F401
    except ImportError as exc:
        raise ValueError("api='accelerate' needs Accelerate: pip install 'commhooks_lab[accelerate]'") from exc
