"""Pools configured as data: a provider, a block shape and limits per pool.

What lives here: :class:`PoolConfig` (one pool, frozen, checked), :func:`pools_from_dicts`
(``Cluster(pools={...})``) and :func:`load_config` (``python -m runtime manager --config
corral.toml``), and what a pool turns into: its :class:`~actors.providers.BlockSpec`
(:meth:`PoolConfig.block_spec`) and its :class:`~policies.scaling.PoolLimits`
(:meth:`PoolConfig.limits`), which the autoscaler and the ``demand`` strategy read.

The keys are Parsl's where they mean the same (``min_blocks``, ``max_blocks``,
``init_blocks``, ``nodes_per_block``, ``workers_per_node``, ``cores_per_worker``,
``parallelism``, ``walltime``, ``max_idletime``, ``provisioning_timeout``,
``partition``, ...); ``spare_blocks`` is GitLab Runner's ``IdleCount``;
``tasks_per_worker`` (fresh workers: each runs that many tasks, then is drained and its
block ends) is Corral's own, and so are the keys that set the worker processes' flags
(``worker_host``, ``worker_port_range``, ``grace``, ``execution``, ``spill_dir``:
:meth:`PoolConfig.worker_flags`) and a Slurm pool's ``signal_warning``. Everything is
checked before anything starts: an unknown key, a value of the wrong type or out of
range, a key that belongs to another provider and a reference to a pool that does not
exist raise
:class:`~runtime.errors.PoolConfigError` naming the pool and the key, with what is
allowed and, for a typo, the closest known name. Pure: no provider is built here
(``runtime/node.py`` does that).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from actors.memory import MemoryConfig, limit_too_small
from actors.providers import DISK_OFF, BlockSpec
from actors.slurm import (
    TIME_FORMS,
    SlurmOptions,
    parse_seconds,
    parse_walltime,
    scheduler_options_problem,
)
from policies import KINDS, PolicyRegistry
from policies.scaling import PoolLimits
from runtime.errors import (
    CorralError,
    MemoryConfigError,
    PolicyConfigError,
    PolicyParamsError,
    PoolConfigError,
    Refusals,
    SchedulerConfigError,
    UnknownPolicyError,
    WalltimeError,
    did_you_mean,
)
from runtime.messages import pool_name_problem

__all__ = [
    "COMMON_KEYS",
    "LOCAL_KEYS",
    "POOL_MEMORY_OPTIONS",
    "PORT_RANGE_FORM",
    "PROVIDERS",
    "SCHEDULER_KEYS",
    "SLURM_KEYS",
    "WORKER_PROCESS_KEYS",
    "PoolConfig",
    "check_fallback",
    "ignored_settings",
    "load_config",
    "load_policies",
    "load_scheduler",
    "local_workers",
    "parse_seconds",
    "pool_fallbacks",
    "pools_from_dicts",
    "port_range",
    "read_config",
    "scheduler_settings",
]

PROVIDERS = ("local", "slurm")

#: keys every pool may have, with their defaults (None: computed or not set)
COMMON_KEYS: Mapping[str, Any] = {
    "provider": "local",
    "min_blocks": 0,
    "max_blocks": None,  # 1, or min_blocks if larger
    "init_blocks": None,  # 1, within min_blocks..max_blocks
    "nodes_per_block": 1,
    "workers_per_node": 1,
    "cores_per_worker": 1,
    "memory_per_worker": 0,
    "disk_per_worker": 0,
    "parallelism": 1.0,
    "walltime": None,
    "drain_period": None,
    "max_idletime": 120.0,
    "provisioning_timeout": None,
    # seconds a running block whose workers all left without a word goes on before it
    # is stopped and replaced as lost ("off": never)
    "lost_grace": 60.0,
    "spare_blocks": 0,
    "tasks_per_worker": None,  # no limit: a worker takes tasks until it is drained
    "fallback": None,
    # false: tasks of no pool (submitted without pool=) never run on its workers, nor
    # count in its demand: the pool runs only the tasks that name it
    "any_pool_tasks": True,
    # the worker processes' own flags (runtime worker --help); None: the worker's default
    "worker_host": None,  # --host; a Slurm pool's default: its node's address ({host})
    "worker_port_range": None,  # --port-range LO-HI
    "grace": None,  # --grace, seconds (the worker's default: 5)
    "execution": None,  # --execution thread|process (the worker's default: thread)
    "spill_dir": None,  # --spill-dir (the worker's default: the system's temp directory)
    # each worker process pinned to one of these accelerators (device ids, or N: "0".."N-1"),
    # Parsl's available_accelerators; None: none pinned
    "accelerators": None,
    # --memory-options: the workers' memory fences (spill, throttle, terminate, ...), a
    # table of MemoryConfig's names (POOL_MEMORY_OPTIONS); None: the worker's defaults
    "memory_options": None,
}

#: the keys of :data:`COMMON_KEYS` that set flags of a worker process: an embedded
#: cluster's in-process workers take none of them
WORKER_PROCESS_KEYS = (
    "worker_host", "worker_port_range", "grace", "execution", "spill_dir", "accelerators",
)  # fmt: skip

#: keys only a pool with ``provider = "local"`` may have
LOCAL_KEYS: Mapping[str, Any] = {
    "provision_delay": 0.0,  # seconds a block stays pending before its processes start
}

#: keys only a pool with ``provider = "slurm"`` may have
SLURM_KEYS: Mapping[str, Any] = {
    "partition": "",
    "account": "",
    "qos": "",
    "exclusive": False,
    "worker_init": "",
    "scheduler_options": "",
    "signal_warning": 0,  # seconds: --signal=B:TERM@N (0: none)
}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:e\d+)?)\s*([a-z]*)")
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
               "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10,
               "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def _size_key(name: str, raw: Mapping[str, Any], key: str, zero: str) -> int:
    """Pool ``name``'s ``key``, a size in bytes (0 if absent: ``zero`` says what it means)."""
    try:
        return _bytes(raw.get(key, 0), zero)
    except ValueError as exc:
        raise PoolConfigError(name, key, f"must be {exc}, got {raw[key]!r}") from None


def _bytes(value: object, zero: str = "the machine's memory") -> int:
    """Bytes from a whole number or a size such as ``"4GiB"`` or ``"500MB"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE.fullmatch(value.strip().lower())
        if m is not None and m.group(2) in _SIZE_UNITS:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    raise ValueError(
        "bytes as a whole number >= 0 or a size such as '4GiB' or '500MB' "
        f"(units b, kb, mb, gb, tb, kib, mib, gib, tib); 0: {zero}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class PoolConfig:
    """One pool: where its blocks come from, their shape and the limits on them. Build
    it with :func:`pools_from_dicts` or :func:`load_config`, which check every value."""

    name: str
    provider: str = "local"
    min_blocks: int = 0
    max_blocks: int = 1
    init_blocks: int = 1
    nodes_per_block: int = 1
    workers_per_node: int = 1
    cores_per_worker: int = 1
    #: bytes; 0: a share of the machine's memory (a local pool's worker: the machine's
    #: over :func:`local_workers`; a Slurm pool's: the node's over ``workers_per_node``)
    memory_per_worker: int = 0
    #: bytes of disk each worker offers for outputs; 0: its file system's free space;
    #: ``DISK_OFF`` (``"off"``): not counted
    disk_per_worker: int = 0
    parallelism: float = 1.0
    walltime: float | None = None  #: seconds; None: no limit (Slurm: the partition's)
    drain_period: float | None = None  #: seconds before the walltime; None: computed
    max_idletime: float = 120.0  #: seconds
    spare_blocks: int = 0  #: blocks kept idle beyond the active tasks' (``demand``)
    #: seconds a block may take from its request to running before it is replaced
    #: (None: it counts as capacity until it runs)
    provisioning_timeout: float | None = None
    #: seconds a running block may go on once every worker of it that joined has left
    #: without a word (stopped, hung, cut off) before it is stopped and replaced as
    #: lost (None: never, ``"off"``)
    lost_grace: float | None = 60.0
    #: tasks each worker runs (tries sent to it) before it is drained and its block
    #: ends (None: no limit)
    tasks_per_worker: int | None = None
    fallback: str | None = None  #: the pool long preempted tasks move to
    #: its workers run tasks of no pool (``pool=`` not given) too, and they count in its
    #: demand; False: only the tasks that name it
    any_pool_tasks: bool = True
    partition: str = ""
    account: str = ""
    qos: str = ""
    exclusive: bool = False
    worker_init: str = ""
    scheduler_options: str = ""
    provision_delay: float = 0.0  #: local only: seconds each block stays pending first
    signal_warning: int = 0  #: Slurm only: seconds: SIGTERM this long before the walltime
    #: the worker processes' flags (:meth:`worker_flags`); empty or None: not given
    worker_host: str = ""
    worker_port_range: tuple[int, int] | None = None
    grace: float | None = None
    execution: str = ""
    spill_dir: str = ""
    #: the workers' memory settings (``--memory-options``: fences, deferrals,
    #: ``disk_limit``), checked against :class:`~actors.memory.MemoryConfig`; empty:
    #: the worker's defaults
    memory_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: the accelerators its workers are pinned to, one each (``CUDA_VISIBLE_DEVICES``
    #: and the like: :func:`~actors.providers.accelerator_env`): a Slurm pool's i-th
    #: worker on a node takes the i-th, a local pool's workers one that no running
    #: worker holds; empty: none pinned
    accelerators: tuple[str, ...] = ()

    @property
    def workers_per_block(self) -> int:
        return self.nodes_per_block * self.workers_per_node

    def block_spec(self) -> BlockSpec:
        """What each block of this pool is: its workers, their cores, memory and disk."""
        return BlockSpec(
            self.workers_per_block,
            self.cores_per_worker,
            self.memory_per_worker,
            self.disk_per_worker,
            self.name,
        )

    def slurm_options(self) -> SlurmOptions:
        """The ``#SBATCH`` options of this pool's blocks (a Slurm pool's)."""
        return SlurmOptions(
            partition=self.partition, account=self.account, qos=self.qos,
            nodes_per_block=self.nodes_per_block, walltime=self.walltime,
            exclusive=self.exclusive, scheduler_options=self.scheduler_options,
            worker_init=self.worker_init, signal_warning=self.signal_warning,
            accelerators=self.accelerators,
        )  # fmt: skip

    def worker_flags(self) -> list[str]:
        """The flags of ``python -m runtime worker`` this pool's keys set (``worker_host``,
        ``worker_port_range``, ``grace``, ``execution``, ``spill_dir``): what its
        providers put on each worker's command line (a Slurm pool without
        ``worker_host``: ``--host {host}``, its node's address, added by its caller)."""
        flags = []
        if self.worker_host:
            flags += ["--host", self.worker_host]
        if self.worker_port_range is not None:
            flags += ["--port-range", "{}-{}".format(*self.worker_port_range)]
        if self.grace is not None:
            flags += ["--grace", f"{self.grace:g}"]
        if self.execution:
            flags += ["--execution", self.execution]
        if self.spill_dir:
            flags += ["--spill-dir", self.spill_dir]
        return flags

    def limits(self) -> PoolLimits:
        """What the autoscaler and its ``demand`` strategy keep to."""
        return PoolLimits(
            min_blocks=self.min_blocks,
            max_blocks=self.max_blocks,
            init_blocks=self.init_blocks,
            parallelism=self.parallelism,
            slots_per_block=self.workers_per_block * self.cores_per_worker,
            max_idletime=self.max_idletime,
            provisioning_timeout=self.provisioning_timeout,
            lost_grace=self.lost_grace,
            spare_blocks=self.spare_blocks,
            any_pool_tasks=self.any_pool_tasks,
        )


# ----------------------------------------------------------------------------- checking


def _meant(key: str, value: object, fits: Callable[[float], bool], whole: bool = True) -> str:
    """The hint of a refused numeric pool key whose ``value`` is a number that ``fits``
    written as text (``"2"``: "; did you mean max_blocks = 2 (a number, not a
    string)?") or, for a ``whole`` key, with a fraction of zero (``3.0``); else ""."""
    number: float | None = None
    text = ""
    if isinstance(value, str):
        try:
            number = int(value.strip()) if whole else float(value.strip())
        except ValueError:
            return ""
        text = " (a number, not a string)"
    elif whole and isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not fits(number):
        return ""
    return f"; did you mean {key} = {number!r}{text}?"


def _whole(pool: str, key: str, value: object, least: int, what: str = "") -> int:
    """Pool ``pool``'s ``key``: a whole number >= ``least`` (``what``: what it is)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        meant = _meant(key, value, lambda n: n >= least)
        raise PoolConfigError(
            pool, key, f"must be a whole number >= {least}{what}, got {value!r}{meant}"
        )
    return value


def _task_limit(pool: str, value: object) -> int | None:
    """Pool ``pool``'s ``tasks_per_worker``: None (no limit) or a whole number >= 1."""
    if value is None:
        return None
    return _whole(
        pool, "tasks_per_worker", value, 1,
        ", the tasks each worker runs before it is drained and its block ends (leave it "
        "out: no limit)",
    )  # fmt: skip


def _flag(pool: str, key: str, value: object, what: str = "") -> bool:
    """Pool ``pool``'s ``key``: true or false (``what``: what it does); the text
    ``"true"`` or ``"false"`` gets the boolean it meant."""
    if isinstance(value, bool):
        return value
    meant = value.strip().lower() if isinstance(value, str) else ""
    hint = f"; did you mean {key} = {meant} (a boolean, not a string)?" if meant in (
        "true", "false") else ""  # fmt: skip
    raise PoolConfigError(pool, key, f"must be true or false{what}, got {value!r}{hint}")


def _text(pool: str, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise PoolConfigError(pool, key, f"must be a string, got {value!r}")
    return value


#: what a port range is, as ``worker_port_range`` and the worker's ``--port-range`` take it
PORT_RANGE_FORM = "LO-HI, two ports from 1 to 65535 with LO <= HI, e.g. 9000-9009"


def port_range(text: object) -> tuple[int, int]:
    """``(lo, hi)`` of a port range ``"LO-HI"`` (:data:`PORT_RANGE_FORM`); ValueError
    (the form and the value) otherwise."""
    lo, dash, hi = text.partition("-") if isinstance(text, str) else ("", "", "")
    try:
        low, high = int(lo), int(hi)
    except ValueError:
        low = high = -1
    if not dash or not 1 <= low <= high <= 65535:
        raise ValueError(f"{PORT_RANGE_FORM}, got {text!r}")
    return (low, high)


def _port_range_key(pool: str, value: object) -> tuple[int, int] | None:
    """Pool ``pool``'s ``worker_port_range``; a list of two ports or a port alone
    get the string they meant."""
    if value is None:
        return None
    try:
        return port_range(value)
    except ValueError as exc:
        meant = ""
        if isinstance(value, list) and len(value) == 2:
            meant = f'; did you mean worker_port_range = "{value[0]}-{value[1]}" (a string)?'
        elif isinstance(value, int) and not isinstance(value, bool):
            meant = f'; did you mean worker_port_range = "{value}-{value}" (a string)?'
        raise PoolConfigError(
            pool, "worker_port_range",
            f"must be a string {exc}{meant} (the ports each worker may listen on for its "
            "peers: give a range at least as wide as the workers of one node)",
        ) from None  # fmt: skip


def _worker_texts(pool: str, provider: str, raw: Mapping[str, Any]) -> dict[str, str]:
    """Pool ``pool``'s ``worker_host``, ``execution`` and ``spill_dir``, checked ("" for
    a key not given): each goes on the worker's command line as it is written, a
    relative ``spill_dir`` made absolute (under this process's working directory: that
    of a local pool's workers and, by default, of a Slurm pool's jobs too, which a
    ``worker_init`` that changes directory would otherwise move it with)."""
    out = {}
    for key in ("worker_host", "execution", "spill_dir"):
        value = raw.get(key)
        if value is None:
            out[key] = ""
            continue
        text = _text(pool, key, value)
        if not text.strip() or text != text.strip():
            raise PoolConfigError(pool, key, f"must be a non-empty string without spaces "
                                  f"around it, got {value!r}")  # fmt: skip
        out[key] = text
    host, execution, spill_dir = out["worker_host"], out["execution"], out["spill_dir"]
    if any(c.isspace() for c in host):
        raise PoolConfigError(
            pool, "worker_host", f"must be one host name or address, got {host!r}"
        )
    if "{host}" in host and provider != "slurm":
        raise PoolConfigError(
            pool, "worker_host",
            f"{host!r}: '{{host}}' is a Slurm node's address, only for provider 'slurm'; "
            "a local pool's workers run on this machine (leave it out: 127.0.0.1)",
        )  # fmt: skip
    if execution and execution not in ("thread", "process"):
        raise PoolConfigError(
            pool, "execution",
            f"must be 'thread' or 'process', got {execution!r}"
            + did_you_mean(execution, ["thread", "process"]),
        )  # fmt: skip
    if spill_dir.startswith("~") or "$" in spill_dir:
        raise PoolConfigError(
            pool, "spill_dir",
            f"is taken as written, with no shell expansion ('~', '$VAR'), got {spill_dir!r}: "
            "give the directory's path",
        )  # fmt: skip
    if spill_dir:  # a relative one is the manager's working directory's, said as such
        out["spill_dir"] = str(Path(spill_dir).absolute())
    return out


#: the names a pool's ``memory_options`` table takes: those of the worker's
#: ``--memory-options`` (:class:`~actors.memory.MemoryConfig`), less ``execution`` and
#: ``spill_dir``, which are pool keys of their own
POOL_MEMORY_OPTIONS = tuple(o for o in MemoryConfig.OPTIONS if o not in ("execution", "spill_dir"))


def _closest_key(key: str, known: Sequence[str], raw: Mapping[str, Any]) -> str:
    """The did-you-mean of an unknown pool key: a memory setting of the workers
    (``spill``, ``throttle``, ..., or a misspelling closest to one) goes in
    ``memory_options``; else the closest key."""
    close = difflib.get_close_matches(key, [*known, *POOL_MEMORY_OPTIONS], n=1, cutoff=0.6)
    if close and close[0] in POOL_MEMORY_OPTIONS and close[0] not in known:
        return (
            f"; did you mean memory_options = {{{close[0]} = {raw[key]!r}}} (the workers' "
            "memory settings)?"
        )
    return did_you_mean(key, known, ".")


def _memory_options_key(pool: str, value: object, memory: int) -> dict[str, Any]:
    """Pool ``pool``'s ``memory_options``: the settings its workers get as
    ``--memory-options``, checked as the worker checks them (its limit: the pool's
    ``memory_per_worker``, else 1 GiB as the worker's check takes it); ``"off"`` turns
    ``spill`` or ``terminate`` off (None, which TOML cannot write); ``disk_limit`` is
    bytes or a size (``"10GiB"``)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PoolConfigError(
            pool, "memory_options",
            "must be a table of the workers' memory settings, e.g. memory_options = "
            f"{{spill = 0.5, throttle = 0.6, terminate = 0.9}}, got {value!r}",
        )  # fmt: skip
    out: dict[str, Any] = {}
    for name, given in value.items():
        key = f"memory_options.{name}"
        if name in ("execution", "spill_dir"):
            raise PoolConfigError(
                pool, key, f"is a pool key of its own: write {name} = {given!r} in the "
                "pool's table, beside memory_options",
            )  # fmt: skip
        if name not in POOL_MEMORY_OPTIONS:
            names = POOL_MEMORY_OPTIONS
            raise PoolConfigError(
                pool, key,
                f"is unknown{did_you_mean(name, names, '.', prefix='memory_options.')} The "
                f"names are: {', '.join(names)} (the worker's "
                "--memory-options, docs/configuration.md#memory)",
            )  # fmt: skip
        if name in ("spill", "terminate", "exit") and given == "off":
            out[name] = None
        elif name == "disk_limit":
            try:
                out[name] = _bytes(given, "the worker's disk")
            except ValueError as exc:
                raise PoolConfigError(pool, key, f"must be {exc}, got {given!r}") from None
        else:
            out[name] = given
    try:
        MemoryConfig.of(memory or 1 << 30, out)
    except MemoryConfigError as exc:
        raise PoolConfigError(
            pool, "memory_options", f"is refused: {getattr(exc, 'problem', exc)}"
        ) from None
    return out


def _accelerators(pool: str, value: object, per_node: int, blocks: int) -> tuple[str, ...]:
    """Pool ``pool``'s ``accelerators``: device ids as strings (``["0", "1"]``, MIG
    UUIDs), or a whole number N for ``"0"`` to ``"N-1"``; enough for one each of the
    workers that run at once on one machine: a Slurm pool's ``workers_per_node``
    (``blocks`` 0), a local pool's ``per_node`` times its ``blocks`` (``max_blocks``)."""
    if value is None:
        return ()
    form = (
        'device ids as strings, one per worker, e.g. accelerators = ["0", "1", "2", "3"] '
        '(or MIG UUIDs), or a whole number N >= 1 for "0" to "N-1"'
    )
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        devices: tuple[str, ...] = tuple(str(i) for i in range(value))
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        devices = tuple(value)
        odd = [v for v in devices if not v or v != v.strip() or "," in v or " " in v]
        if odd:
            raise PoolConfigError(
                pool, "accelerators",
                f"must be {form}; {odd[0]!r} is not one device id (each worker gets exactly "
                "one: no empty id, spaces or commas)",
            )  # fmt: skip
        twice = [v for v in dict.fromkeys(devices) if devices.count(v) > 1]
        if twice:
            raise PoolConfigError(
                pool, "accelerators",
                f"names {twice[0]!r} twice: each device goes to one worker; list each once",
            )  # fmt: skip
    else:
        meant = ""
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            meant = f"; did you mean accelerators = {[str(v) for v in value]!r} (strings)?"
        raise PoolConfigError(pool, "accelerators", f"must be {form}, got {value!r}{meant}")
    workers = per_node * max(blocks, 1)
    if workers > len(devices):
        how = (
            f"max_blocks ({blocks}) x workers_per_node ({per_node}) = {workers} workers may "
            "run at once on this machine"
            if blocks
            else f"workers_per_node = {per_node} workers run on each node"
        )
        raise PoolConfigError(
            pool, "accelerators",
            f"has {len(devices)} ({', '.join(devices)}) but {how}, each pinned to one of its "
            f"own: list {workers} device ids, or run at most {len(devices)} workers there",
        )  # fmt: skip
    return devices


def _signal_warning(pool: str, value: object, walltime: float | None) -> int:
    """A Slurm pool's ``signal_warning``: whole seconds from 0 to 65535 (Slurm's
    ``--signal=B:TERM@N``), shorter than the walltime."""
    try:
        seconds = parse_seconds(value)
    except ValueError as exc:
        raise PoolConfigError(pool, "signal_warning", str(exc)) from None
    if not seconds.is_integer() or seconds > 65535:
        raise PoolConfigError(
            pool, "signal_warning",
            f"must be whole seconds from 0 to 65535 (sbatch --signal=B:TERM@N), got {value!r}",
        )  # fmt: skip
    if walltime is not None and seconds >= walltime:
        raise PoolConfigError(
            pool, "signal_warning", f"must be shorter than walltime ({walltime:g} s), got {value!r}"
        )
    return int(seconds)


def _pool(name: object, raw: object, source: str, refuse: Refusals) -> PoolConfig | None:
    """The pool, or None when ``refuse`` kept what is wrong with it."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problem = pool_name_problem(name)
        refuse(PoolConfigError(
            str(name), "",
            f"the pool's name (its table's, [pools.NAME]) must be letters, digits, '_', '.' "
            f"and '-', starting with a letter or digit, got {name!r}"
            + (f" ({problem}): rename the table, e.g. [pools.cpu]" if problem else ""),
            source,
        ))  # fmt: skip
        return None
    if not isinstance(raw, Mapping):
        refuse(PoolConfigError(name, "", f"must be a table of settings, got {raw!r}", source))
        return None
    known = [*COMMON_KEYS, *LOCAL_KEYS, *SLURM_KEYS]
    unknown = refuse.unknown(raw, known, lambda key: PoolConfigError(
        name, key,
        f"is unknown{_closest_key(key, known, raw)} The keys are: {', '.join(known)}",
        source,
    ))  # fmt: skip

    def check(fields: Mapping[str, Any]) -> PoolConfig:
        try:
            return _checked(name, fields)
        except PoolConfigError as err:
            if source and not err.source:
                raise PoolConfigError(err.pool, err.key, err.problem, source) from None
            raise

    # Kept (else the first unknown key raised): the known keys' problems too, each in
    # turn (a bad provider's pool is not checked further: its keys would be checked
    # against the other provider's).
    fields = {k: v for k, v in raw.items() if k in known}
    pool, refused = refuse.per_key(check, fields, lambda err: err.key, final=("provider",))
    return None if refused or unknown else pool


#: the keys of seconds that refuse 0 as well as a negative number
_MORE_THAN_0 = frozenset({"provisioning_timeout", "lost_grace"})


def _checked(name: str, raw: Mapping[str, Any]) -> PoolConfig:
    provider = raw.get("provider", "local")
    if provider not in PROVIDERS:
        raise PoolConfigError(
            name, "provider",
            f"must be one of {', '.join(map(repr, PROVIDERS))}, got {provider!r}"
            + did_you_mean(str(provider), list(PROVIDERS)),
        )  # fmt: skip
    if provider != "slurm":
        for key in SLURM_KEYS:
            if key in raw:
                raise PoolConfigError(
                    name, key, f"is a Slurm setting: only for provider 'slurm', not {provider!r}"
                )
    if provider != "local":
        for key in LOCAL_KEYS:
            if key in raw:
                raise PoolConfigError(
                    name, key, f"is a local setting: only for provider 'local', not {provider!r}"
                )
    lo = _whole(name, "min_blocks", raw.get("min_blocks", 0), 0)
    hi = _whole(name, "max_blocks", raw.get("max_blocks", max(1, lo)), 1)
    if lo > hi:
        raise PoolConfigError(name, "min_blocks", f"is {lo}, more than max_blocks ({hi})")
    init = _whole(name, "init_blocks", raw.get("init_blocks", min(max(1, lo), hi)), 0)
    if not lo <= init <= hi:
        raise PoolConfigError(
            name, "init_blocks", f"must be from min_blocks ({lo}) to max_blocks ({hi}), got {init}"
        )
    spare = _whole(name, "spare_blocks", raw.get("spare_blocks", 0), 0)
    if spare > hi:
        raise PoolConfigError(
            name, "spare_blocks", f"must be from 0 to max_blocks ({hi}), got {spare}"
        )
    nodes = _whole(name, "nodes_per_block", raw.get("nodes_per_block", 1), 1)
    if provider == "local" and nodes != 1:
        raise PoolConfigError(
            name, "nodes_per_block", f"a local block is this machine: must be 1, got {nodes}"
        )
    parallelism = raw.get("parallelism", 1.0)
    if (
        isinstance(parallelism, bool)
        or not isinstance(parallelism, int | float)
        or not 0 <= parallelism <= 1
    ):
        meant = _meant("parallelism", parallelism, lambda n: 0 <= n <= 1, whole=False)
        raise PoolConfigError(
            name, "parallelism", f"must be a number from 0 to 1, got {parallelism!r}{meant}"
        )
    seconds: dict[str, float | None] = {}
    for key in ("walltime", "drain_period", "max_idletime", "provisioning_timeout",
                "provision_delay", "grace", "lost_grace"):  # fmt: skip
        value = raw.get(key, {**COMMON_KEYS, **LOCAL_KEYS}[key])
        if value is None or (key == "lost_grace" and value == "off"):
            seconds[key] = None
            continue
        try:
            seconds[key] = (parse_walltime if key == "walltime" else parse_seconds)(value)
        except WalltimeError as exc:
            raise PoolConfigError(name, key, exc.problem) from None
        except ValueError as exc:
            if isinstance(value, int | float) and value < 0:  # a number, only not >= 0
                # (of a key that refuses 0 too, what it refuses next: not ">= 0")
                least = "more than 0" if key in _MORE_THAN_0 else ">= 0"
                off = '; "off": never' if key == "lost_grace" else ""
                raise PoolConfigError(
                    name, key, f"must be {least} (seconds, or a Slurm time{off}), got {value!r}"
                ) from None
            if key == "lost_grace":
                raise PoolConfigError(
                    name, key, f'must be "off" (never) or {TIME_FORMS}, got {value!r}'
                ) from None
            raise PoolConfigError(name, key, str(exc)) from None
    if seconds["provisioning_timeout"] == 0:
        raise PoolConfigError(
            name, "provisioning_timeout",
            "must be more than 0 (leave it out: a block not running yet counts until it runs)",
        )  # fmt: skip
    if seconds["lost_grace"] == 0:
        raise PoolConfigError(
            name, "lost_grace",
            "must be more than 0 (seconds, or a Slurm time; \"off\": a block whose workers "
            "all left without a word is never stopped and replaced)",
        )  # fmt: skip
    walltime, drain = seconds["walltime"], seconds["drain_period"]
    if drain is not None and walltime is not None and drain >= walltime:
        raise PoolConfigError(
            name, "drain_period", f"must be shorter than walltime ({walltime:g} s), got {drain:g}"
        )
    memory = _size_key(name, raw, "memory_per_worker", "the machine's memory")
    too_small = limit_too_small(raw.get("memory_per_worker"), memory)
    if too_small:  # a size without its unit: every producer of the pool would stall
        raise PoolConfigError(
            name, "memory_per_worker", f"= {raw['memory_per_worker']!r} {too_small}"
        )
    disk = (
        DISK_OFF
        if raw.get("disk_per_worker") == "off"
        else _size_key(name, raw, "disk_per_worker", "its file system's free space")
    )
    fallback = raw.get("fallback")
    if fallback is not None:
        fallback = _text(name, "fallback", fallback)
        if fallback == name:
            raise PoolConfigError(name, "fallback", "a pool cannot fall back to itself")
    exclusive = _flag(name, "exclusive", raw.get("exclusive", False))
    any_pool_tasks = _flag(
        name, "any_pool_tasks", raw.get("any_pool_tasks", True),
        " (false: its workers run only the tasks that name this pool, and tasks "
        "submitted without pool= neither run there nor scale it)",
    )  # fmt: skip
    texts = {
        k: _text(name, k, raw.get(k, ""))
        for k in SLURM_KEYS
        if k not in ("exclusive", "signal_warning")
    }
    problem = scheduler_options_problem(texts["scheduler_options"])
    if problem:
        raise PoolConfigError(name, "scheduler_options", problem)
    per_node = _whole(name, "workers_per_node", raw.get("workers_per_node", 1), 1)
    return PoolConfig(
        name=name,
        provider=provider,
        min_blocks=lo,
        max_blocks=hi,
        init_blocks=init,
        nodes_per_block=nodes,
        workers_per_node=per_node,
        cores_per_worker=_whole(name, "cores_per_worker", raw.get("cores_per_worker", 1), 1),
        memory_per_worker=memory,
        disk_per_worker=disk,
        parallelism=float(parallelism),
        walltime=walltime,
        drain_period=drain,
        max_idletime=seconds["max_idletime"] or 0.0,
        provisioning_timeout=seconds["provisioning_timeout"],
        lost_grace=seconds["lost_grace"],
        spare_blocks=spare,
        tasks_per_worker=_task_limit(name, raw.get("tasks_per_worker")),
        fallback=fallback,
        any_pool_tasks=any_pool_tasks,
        exclusive=exclusive,
        provision_delay=seconds["provision_delay"] or 0.0,
        signal_warning=_signal_warning(name, raw.get("signal_warning", 0), walltime),
        worker_port_range=_port_range_key(name, raw.get("worker_port_range")),
        grace=seconds["grace"],
        **_worker_texts(name, provider, raw),
        **texts,
        memory_options=_memory_options_key(name, raw.get("memory_options"), memory),
        accelerators=_accelerators(
            name, raw.get("accelerators"), per_node, 0 if provider == "slurm" else hi
        ),
    )


def local_workers(pools: Mapping[str, PoolConfig]) -> int:
    """The most worker processes the ``local`` pools run at once on this machine: each
    pool's workers per block at ``max_blocks`` (or ``init_blocks``, if more). A local
    worker whose pool sets no ``memory_per_worker`` takes this share of the machine's
    memory (``--memory-share``), so that together they cannot claim more than it has."""
    return sum(
        p.workers_per_block * max(p.max_blocks, p.init_blocks)
        for p in pools.values()
        if p.provider == "local"
    )


def pools_from_dicts(
    pools: Mapping[str, Any], *, source: str = "", refuse: Refusals | None = None
) -> dict[str, PoolConfig]:
    """Check ``{pool name: {key: value}}`` and return the pools by name, in order.
    Raises :class:`~runtime.errors.PoolConfigError` for the first problem; with a
    ``refuse`` that keeps them, every unknown key of every pool, or else each of its
    keys' problems (:meth:`~runtime.errors.Refusals.per_key`), is kept there and the
    pools without one are returned."""
    refuse = refuse or Refusals()
    if isinstance(pools, list) and all(isinstance(p, Mapping) for p in pools):
        named = next((str(p["name"]) for p in pools if "name" in p), "NAME")
        refuse(PoolConfigError(
            "", "pools",
            f"is a list of tables ([[pools]]), got {pools!r}; write [pools.NAME] tables, one "
            f"per pool, its name in the header and without a name key (e.g. [pools.{named}]); "
            "in Python, a dict {name: {key: value}}",
            source,
        ))  # fmt: skip
        return {}
    if not isinstance(pools, Mapping) or not pools:
        refuse(PoolConfigError("", "pools", f"must name at least one pool, got {pools!r}", source))
        return {}
    made = {str(name): _pool(name, raw, source, refuse) for name, raw in pools.items()}
    # Each pool's fallback against the pools of the file, read from its own table: also
    # in a pool refused for another key (a check keeps every problem in one run).
    for name, raw in pools.items():
        fallback = raw.get("fallback") if isinstance(raw, Mapping) else None
        if isinstance(fallback, str) and fallback != name and fallback not in made:
            refuse(PoolConfigError(
                str(name), "fallback",
                f"names no pool: {fallback!r}{did_you_mean(fallback, list(made), '.')} "
                f"The pools are: {', '.join(made)}",
                source,
            ))  # fmt: skip
    held: dict[str, str] = {}  # a device -> the first local pool that lists it
    for name, pool in made.items():
        for device in pool.accelerators if pool is not None and pool.provider == "local" else ():
            other = held.setdefault(device, name)
            if other != name:
                refuse(PoolConfigError(
                    name, "accelerators",
                    f"lists {device!r}, which local pool {other!r} lists too: their workers "
                    "run on this machine and would share it; give each pool devices of its own",
                    source,
                ))  # fmt: skip
                break
    return {name: pool for name, pool in made.items() if pool is not None}


def check_fallback(kind: str, name: str, params: Mapping[str, Any], pools: Collection[str]) -> None:
    """A retry policy's ``fallback`` (``{pool: pool its long tasks move to}``) must name
    configured pools, when the cluster has them: a task moved to a pool no block ever
    serves would wait for good. Raises :class:`~runtime.errors.PolicyParamsError`
    (``Cluster(policies=...)`` at start, ``policy set retry ...`` live). Without
    configured pools (workers join by hand, ``--pool``) nothing is checked."""
    fallback = params.get("fallback")
    if kind != "retry" or not pools or not isinstance(fallback, Mapping):
        return
    known = list(pools)
    for pool, to in fallback.items():
        for which, named in (("from", pool), ("to", to)):
            if isinstance(named, str) and named not in pools:
                raise PolicyParamsError(
                    kind, name,
                    f"fallback {pool!r} -> {to!r}: {named!r} ({which}) is not a configured "
                    f"pool{did_you_mean(named, known, '.')} The pools are: {', '.join(known)}",
                )  # fmt: skip


def pool_fallbacks(
    kind: str, name: str, params: Mapping[str, Any], fallback: Mapping[str, str]
) -> dict[str, Any]:
    """The parameters of a policy of ``kind`` and ``name`` with the configured pools'
    ``fallback`` map (``{pool: its fallback}``) put in: the default retry policy's
    ``fallback``, at start and whenever it is set again (``policy set retry default
    max_lost=3`` keeps the pools' fallbacks), unless the parameters give one. Any other
    policy's parameters are returned as they are."""
    if fallback and kind == "retry" and name == "default" and "fallback" not in params:
        return {**params, "fallback": dict(fallback)}
    return dict(params)


#: the top-level tables of a manager's configuration file
SECTIONS = ("pools", "alerting", "alerts", "policies", "scheduler")


def read_config(path: str | os.PathLike[str], refuse: Refusals | None = None) -> dict[str, Any]:
    """A manager's configuration file as TOML data: its tables ``[pools.<name>]``,
    ``[alerting]``, ``[[alerts]]``, ``[policies]`` and ``[scheduler]`` (any other
    top-level key raises :class:`~runtime.errors.PoolConfigError`, or each is kept by a
    ``refuse`` that keeps them); checks nothing inside them. A file that cannot be read
    as TOML raises."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise PoolConfigError("", "", f"cannot read the file: {exc}", str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise PoolConfigError("", "", f"is not valid TOML: {exc}", str(path)) from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8; a Latin-1 or UTF-16 file is not
        raise PoolConfigError(
            "", "", f"is not UTF-8 text, as TOML must be ({exc.reason} at byte {exc.start}): "
            "save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)", str(path)
        ) from None  # fmt: skip
    (refuse or Refusals()).unknown(data, SECTIONS, lambda key: PoolConfigError(
        "", key, f"is not a setting{did_you_mean(key, list(SECTIONS), '.')} Pools go "
        "under [pools.<name>], alert rules under [[alerts]], their settings under "
        "[alerting], the policies to start with under [policies], the scheduler's "
        "settings under [scheduler]", str(path)
    ))  # fmt: skip
    return data


def load_policies(
    path: str | os.PathLike[str],
    registry: PolicyRegistry | None = None,
    refuse: Refusals | None = None,
) -> dict[str, tuple[str, dict[str, Any]]]:
    """The ``[policies]`` table of a manager's configuration file: ``{kind: (name,
    params)}``, the policies it starts with. Each key is a kind; its value the policy's
    name (``priority = "long-first"``), or a table with ``name`` and the policy's
    parameters (``[policies.retry]``, ``name = "default"``, ``max_lost = 2``). With a
    ``registry`` every policy is made once, so an unknown name, bad parameters or a
    policy of the wrong kind are refused here (the registry's words); a scaling policy
    needs pools. :class:`~runtime.errors.PolicyConfigError` for the first thing refused,
    or, with a ``refuse`` that keeps them, each kind's refusal kept there (the others
    returned)."""
    refuse = refuse or Refusals()
    data = read_config(path, refuse)
    table = data.get("policies", {})
    source = str(path)
    if not isinstance(table, Mapping):
        refuse(PolicyConfigError("", "must be a table: [policies], one key per kind", source))
        return {}
    refuse.unknown(table, KINDS, lambda kind: PolicyConfigError(
        kind, f"is not a kind of policy{did_you_mean(kind, KINDS, '.')} The kinds "
        f"are: {', '.join(KINDS)}", source,
    ))  # fmt: skip
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for kind, value in table.items():
        if kind not in KINDS:
            continue
        if isinstance(value, str):
            name, params = value, {}
        elif isinstance(value, Mapping) and isinstance(value.get("name"), str):
            params = {k: v for k, v in value.items() if k != "name"}
            name = value["name"]
        else:
            refuse(PolicyConfigError(
                kind, f"must be a policy's name (text), or a table with its name (name = "
                f'"...") and its parameters, got {value!r}', source,
            ))  # fmt: skip
            continue
        if kind == "scaling" and not data.get("pools"):
            refuse(PolicyConfigError(
                kind, "needs pools: a manager without [pools.<name>] tables has no "
                "autoscaler, so no scaling policy (docs/configuration.md#pools)", source,
            ))  # fmt: skip
            continue
        if registry is not None:
            try:
                registry.create(kind, name, params)
            except CorralError as exc:
                err = exc
                if isinstance(exc, UnknownPolicyError) and not exc.in_config:
                    # a name of one's own, whose module the manager did not import
                    err = UnknownPolicyError(exc.kind, exc.name, exc.available, in_config=True)
                refused = PolicyConfigError(kind, f"is refused: {err}".rstrip("."), source)
                refused.__cause__ = err
                refuse(refused)
                continue
        out[kind] = (name, params)
    return out


#: the built-in scaling policies that start and keep each pool's target (``min_blocks``)
#: and never read its ``init_blocks`` (only ``demand`` does)
_TARGET_POLICIES = ("fixed", "queue")


def ignored_settings(
    path: str | os.PathLike[str], pools: Mapping[str, PoolConfig], scaling: str
) -> list[tuple[str, str]]:
    """``(pool, why)`` for each pool whose configuration file at ``path`` sets a key
    that has no effect under the scaling policy named ``scaling``: ``init_blocks``
    (more than ``min_blocks``) under ``fixed`` or ``queue``, which start the pool at
    ``min_blocks``. What ``check --config`` and a manager's start warn of."""
    if scaling not in _TARGET_POLICIES:
        return []
    raw = read_config(path, Refusals(keep=True)).get("pools", {})  # (refused elsewhere)
    out = []
    for name, pool in pools.items():
        given = raw.get(name, {}) if isinstance(raw, Mapping) else {}
        if "init_blocks" in given and pool.init_blocks > pool.min_blocks:
            out.append((name, (
                f"init_blocks = {pool.init_blocks} has no effect under the {scaling!r} "
                f"scaling policy: it starts and keeps the pool at min_blocks "
                f"({pool.min_blocks}) blocks. Set min_blocks = {pool.init_blocks} to keep "
                f"{pool.init_blocks} block(s) running, or take scaling = \"demand\" "
                "(which starts init_blocks) under [policies]; see "
                "docs/policies.md#scaling"
            )))  # fmt: skip
    return out


def load_config(
    path: str | os.PathLike[str], refuse: Refusals | None = None
) -> dict[str, PoolConfig]:
    """The pools of a TOML file: one table per pool under ``[pools.<name>]`` (none if
    the file has only alerting settings); ``refuse`` as for :func:`pools_from_dicts`."""
    data = read_config(path, refuse)
    if "pools" not in data and data:
        return {}
    return pools_from_dicts(data.get("pools", {}), source=str(path), refuse=refuse)


# ----------------------------------------------------------------------------- [scheduler]

#: what each key of a manager's ``[scheduler]`` table takes: the fields of
#: :class:`~actors.scheduler_records.SchedulerConfig` an operator sets (the others are
#: set by the manager itself: see :data:`_SCHEDULER_ELSEWHERE`)
SCHEDULER_KEYS: Mapping[str, str] = {
    "saturation": "a number > 0",
    "backlog": "seconds >= 0",
    "max_per_core": "a whole number >= 1",
    "long_task": "seconds >= 0 (inf: none by its duration)",
    "unknown_long": "true or false",
    "unknown_duration": "seconds >= 0",
    "takeback_after": "seconds >= 0 (inf: never)",
    "unreachable_for": "seconds >= 0 (inf: never)",
    "stall_timeout": "seconds > 0",
    "drain_period": "seconds >= 0 (leave it out: computed per pool)",
    "walltime_grace": "seconds >= 0",
    "unknown_output": "bytes",
    "prune_depth": "a whole number >= 0",
    "checkpoint_bytes": "bytes",
    "checkpoint_inline_bytes": "bytes",
    "policy_budget": "seconds > 0 (inf: never)",
    "policy_slow_turns": "a whole number >= 1",
    "policy_slow_window": "seconds > 0 (inf: never)",
    "policy_too_slow": "seconds > 0 (inf: never)",
    "story_length": "a whole number >= 1",
    "feed_length": "a whole number >= 1",
    "submit_max_priority": "a number >= 0 (inf: no cap)",
}

#: SchedulerConfig's fields the manager sets itself, and where to set them instead
_SCHEDULER_ELSEWHERE = {
    "monitor": "is set by the manager: on with its monitoring database (--monitoring, "
    "the default), off with --no-monitoring",
    "drain_periods": "is set per pool: drain_period in [pools.NAME]",
    "tasks_per_worker": "is set per pool: tasks_per_worker in [pools.NAME]",
}


def _scheduler_value(key: str, value: object) -> object:
    """``value`` of ``[scheduler]``'s ``key`` as SchedulerConfig takes it; ValueError
    (what it must be, with the number meant when it was written as text) otherwise."""
    what = SCHEDULER_KEYS[key]
    if what == "true or false":
        if isinstance(value, bool):
            return value
        raise ValueError(f"must be true or false, got {value!r}")
    if what == "bytes":
        try:
            return _bytes(value, "none")
        except ValueError as exc:
            raise ValueError(f"must be {exc}, got {value!r}") from None
    whole = what.startswith("a whole number")
    least = 1 if ">= 1" in what else 0
    positive = "> 0" in what
    endless = "inf:" in what

    def fits(n: float) -> bool:
        return (n > 0 if positive else n >= least) and (endless or math.isfinite(n))

    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or (whole and not isinstance(value, int)) or not fits(float(value)):  # type: ignore[arg-type]
        meant = _meant(key, value, fits, whole=whole)
        raise ValueError(f"must be {what}, got {value!r}{meant}")
    return value


def scheduler_settings(
    table: object, source: str = "", refuse: Refusals | None = None
) -> dict[str, Any]:
    """The settings of a ``[scheduler]`` table (``{key: value}``, only those given),
    each checked: :class:`~runtime.errors.SchedulerConfigError` naming the key (with the
    closest one for an unknown key) and the file; with a ``refuse`` that keeps them,
    every refused key is kept there and the others returned."""
    refuse = refuse or Refusals()
    if not isinstance(table, Mapping):
        refuse(SchedulerConfigError(
            "", f"must be a table: [scheduler], one key per setting, got {table!r}", source
        ))  # fmt: skip
        return {}
    known = list(SCHEDULER_KEYS)
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in _SCHEDULER_ELSEWHERE:
            refuse(SchedulerConfigError(key, _SCHEDULER_ELSEWHERE[key], source))
        elif key not in SCHEDULER_KEYS:
            refuse(SchedulerConfigError(
                str(key), f"is unknown{did_you_mean(key, known, '.')} The keys are: "
                f"{', '.join(known)}", source,
            ))  # fmt: skip
        else:
            try:
                out[key] = _scheduler_value(key, value)
            except ValueError as exc:
                refuse(SchedulerConfigError(key, str(exc), source))
    return out


def load_scheduler(path: str | os.PathLike[str], refuse: Refusals | None = None) -> dict[str, Any]:
    """The ``[scheduler]`` table of a manager's configuration file, checked
    (:func:`scheduler_settings`): the :class:`~actors.scheduler_records.SchedulerConfig`
    settings it gives (none without the table)."""
    data = read_config(path, refuse)
    if "scheduler" not in data:
        return {}
    return scheduler_settings(data["scheduler"], str(path), refuse)
