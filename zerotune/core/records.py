"""What a run reports and what the cost model predicts of it: run.json's shapes, each field defined once.

The trainer writes ``RunMetrics`` (``zerotune/trainer/train.py``); ``costmodel.predict`` returns a ``Prediction``,
the run.json the trainer would write, under the same field names (``StepMetrics``, the fields both have), plus what
only a prediction knows (its breakdown, whether it fits, its error band). Both are ``TypedDict``s: plain dicts at
run time, stored and served as JSON unchanged, with their keys checked by mypy wherever they travel (an executor's
``TrialResult.metrics``, the stored trial, the answer). The annotations are evaluated (no ``from __future__ import
annotations``): Python 3.11 reads ``NotRequired`` off them only so.
"""

from typing import Any, Literal, NotRequired, TypedDict

from zerotune.core.volume import Volume

MemoryCategory = Literal["params", "secondary_params", "grads", "optim_states", "comm_buffers", "activations"]
MEMORY_CATEGORIES: tuple[MemoryCategory, ...] = ("params", "secondary_params", "grads", "optim_states",
                                                 "comm_buffers", "activations")
"""What the memory of a rank is booked under, by the engine's accountant and by the cost model alike."""


class MemoryBytes(TypedDict):
    """Bytes per rank by category (the engine's accountant books them, ``trainer.accountant``; the cost model
    predicts them, ``costmodel.memory``) and ``peak``, the most of their sum at once."""

    params: int
    secondary_params: int
    grads: int
    optim_states: int
    comm_buffers: int
    activations: int
    peak: int
    cuda_max_allocated: NotRequired[int]
    """What torch's allocator held at most (``torch.cuda.max_memory_allocated``): measured on a GPU only."""
    cuda_max_reserved: NotRequired[int]
    """What torch's caching allocator reserved from the device at most (``torch.cuda.max_memory_reserved``): measured
    on a GPU only. Over ``cuda_max_allocated`` it is the allocator's fragmentation, which the cost model's reserve
    books (``costmodel.memory.FRAGMENTATION``)."""


class Quantization(TypedDict):
    """Elements block-quantized plus dequantized per optimizer step (``volume.quant_elements``)."""

    elements: int
    seconds: NotRequired[float]
    """Wall seconds in those calls (measured only)."""


class StepMetrics(TypedDict):
    """The fields a measured run and a prediction both report, alike."""

    world_size: int
    step_time_s: float
    """Seconds per optimizer step (measured: the median of the timed steps)."""
    tokens_per_s: float
    """Tokens of the whole cluster per second."""
    tflops_per_rank: float
    """Model FLOPs (``ModelSpec.flops_per_token``) per rank per second, in TFLOPS."""
    bytes_per_level: Volume
    """Bytes sent per rank per step by level and collective kind."""
    quantization: Quantization
    memory_bytes: MemoryBytes
    grad_accum_steps: int
    global_batch: int
    """Sequences per optimizer step: world · micro-batch · ``grad_accum_steps``."""


class Spread(TypedDict):
    """Median and quartiles of a run's timed steps (``trainer.health.spread``)."""

    median: float
    q1: float
    q3: float
    n: int


class Health(TypedDict):
    """Whether the run learned (``trainer.health.health``): ``verdict`` ok, nan, diverged or flat, with the
    figures read; the trend's fit where there were steps enough to fit one."""

    verdict: Literal["ok", "nan", "diverged", "flat"]
    evidence: str
    slope: NotRequired[float]
    noise: NotRequired[float]
    t: NotRequired[float]
    critical_t: NotRequired[float]
    steps_fitted: NotRequired[int]


class Host(TypedDict):
    """Rank 0's host, the CPUs it may run on and the ranks on it (``trainer.train.host_facts``)."""

    name: str
    cpus: int
    local_ranks: int


class Remeasured(TypedDict):
    """A measured trial run a second time, its timed steps pooled with the first run's (``tuner.remeasure``)."""

    runs: int
    timed_steps_s: list[float]
    spread: Spread
    first_value: float
    second_value: float | None
    health_again: str | None


class RunMetrics(StepMetrics):
    """A short run's run.json, as rank 0 of ``python -m zerotune.trainer.train`` writes it."""

    status: Literal["ok"]
    steps: int
    warmup_steps: int
    step_times_s: list[float]
    step_time_spread: Spread
    seconds_per_level: dict[str, dict[str, float]]
    """Rank 0's seconds in collectives per step, by level and kind (median over the timed steps)."""
    loss: list[float]
    grad_norm: list[float]
    health: Health
    dtype: str
    device: str
    emulated: bool
    """The cluster's devices are not this run's (bytes, memory and learning carry over; times do not)."""
    backend: str
    model: dict[str, Any]
    cluster: dict[str, Any]
    strategy: dict[str, Any]
    """``ModelSpec``, ``ClusterSpec`` and ``Strategy`` as ``to_dict`` writes them."""
    data: dict[str, Any]
    config: dict[str, Any]
    torch_version: str
    host: Host
    profile: NotRequired[dict[str, Any]]
    """One more step under the profiler (``--profile``)."""
    emulation: NotRequired[dict[str, Any]]
    """The emulated cluster's links, where the run was an emulation (``zerotune train --emulate``, the ``local``
    executor: ``tuner.executors.emulate``)."""
    remeasured: NotRequired[Remeasured]
    """Where the tuner ran the trial twice: its value and spread are then the pooled runs'."""


class Breakdown(TypedDict):
    """Where a predicted step's seconds go (``costmodel.pipeline``), per optimizer step."""

    compute_s: float
    comm_s: float
    """Every collective of the micro-steps, overlapped or not."""
    exposed_comm_s: float
    """What the micro-steps take beyond their compute and slow-down: communication nothing hid."""
    overlap_slowdown_s: float
    boundary_s: float
    optimizer_s: float
    overhead_s: float
    host_wait_s: float
    """Seconds the device waits for the host to issue blocks (a runner's host floor)."""
    memory_bound_s: float
    attention_s: float
    attention_of_peak: float


class Band(TypedDict):
    """How far off the model was on a set of published items (``costmodel.error.band_of``): how many, and the median
    and 90th percentile of their absolute relative errors (None: no item)."""

    count: int
    median: float | None
    p90: float | None


class DeviceBand(TypedDict):
    """The bands of the items measured on the prediction's device (``costmodel.error``), where it had enough."""

    device: str | None
    rows: NotRequired[Band]
    comparisons: NotRequired[Band]


class Collectives(TypedDict):
    """A runner's vendor collectives measured off the model's ring at a prediction's scale (``costmodel.error``)."""

    library: str
    gpus: int
    measured_over_predicted: float
    source: str


class Lean(TypedDict):
    """The model's lean on checkpointed runs against uncheckpointed ones in the published tables that measured both
    (``costmodel.error``): checkpointed figures sat ``lean`` from the others."""

    lean: float
    source: str


class ErrorBand(TypedDict):
    """The model's measured error a prediction carries (``costmodel.error.error_band``): median and 90th percentile
    of its published figures (rows) and of its strategy comparisons, and where they come from."""

    row_median: float | None
    row_p90: float | None
    comparison_median: float | None
    comparison_p90: float | None
    source: str
    device: NotRequired[DeviceBand]
    collectives: NotRequired[Collectives]
    checkpointing: NotRequired[Lean]


class DeepSpeedStep(TypedDict):
    """What a DeepSpeed ZeRO-3 run of the prediction does by its coordinator's rules (``coordinator.deepspeed_step``):
    the stage-3 settings it runs under, the times it gathers its partitioned parameters, the most it holds."""

    stage3_settings: str
    stage3: dict[str, int]
    gathered_per_step: float
    gathered_forward: float
    gathered_backward: float
    held_peak_bytes: int


class Overflow(TypedDict):
    """Why a prediction does not fit (``costmodel.memory.overflow``): its largest category and by how much."""

    category: str
    bytes: int
    over_by_bytes: int
    reason: str


class MemoryReserve(TypedDict):
    """What a prediction keeps free beside ``memory_bytes.peak`` (``costmodel.memory.runtime_reserve``): the device
    context, the collective library's buffers and the caching allocator's fragmentation, or what the request set."""

    context_bytes: int
    """The device context and the BLAS library's workspaces."""
    collective_bytes: int
    """The collective library's buffers, over every communicator the run creates."""
    communicators: int
    """The communicators booked (one per process group the run's collectives use, and the default group)."""
    fragmentation_bytes: int
    """What the caching allocator reserves beyond what it hands out, at the peak."""
    total_bytes: int
    """The reserve: the three parts, or what the request set."""
    source: Literal["computed", "request"]
    """``computed``: the three parts; ``request``: the request's ``memory_reserve_gib`` (the parts still shown)."""
    reason: str
    """The reserve and its parts in GiB, in words."""


class MemoryNote(TypedDict):
    """How much of a rank's memory an answer uses and how much it kept free, in GiB (``costmodel.memory.memory_note``):
    what a recommendation says of its memory."""

    peak_gib: float
    """The predicted peak the allocator hands out."""
    capacity_gib: float
    """The device's memory."""
    reserve_gib: float
    """Kept for the runtime beside the peak (``MemoryReserve.total_bytes``)."""
    context_gib: float
    collective_gib: float
    communicators: int
    fragmentation_gib: float
    headroom_gib: float
    """Left beyond the peak and the reserve."""
    source: Literal["computed", "request"]
    reason: str
    """In words: the peak, the reserve and why, what is left."""


class Prediction(StepMetrics):
    """``costmodel.predict``'s answer: the run.json the trainer would write, and what only a prediction knows."""

    status: Literal["predicted"]
    feasible: bool
    """Whether ``memory_bytes.peak`` fits the device's memory less ``memory_reserve``."""
    headroom_bytes: int
    """The device's memory less ``memory_reserve`` less ``memory_bytes.peak`` (negative: over)."""
    memory_reserve: MemoryReserve
    """What it kept free beside the peak for the runtime, and why (``costmodel.memory.runtime_reserve``)."""
    calibration: str
    error_band: ErrorBand | None
    breakdown: Breakdown
    deepspeed: NotRequired[DeepSpeedStep]
    """A run by DeepSpeed's ZeRO-3 (``Calibration.gathers = "module"``) of a strategy that shards parameters."""
    overflow: NotRequired[Overflow]
    """Only where it does not fit."""


TrialMetrics = RunMetrics | Prediction
"""What a trial reports: the run.json of a measured run, or the prediction (the ``model`` executor)."""
