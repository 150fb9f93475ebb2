"""Launch a multi-process job's ranks with torchrun, one Hydra job at a time.

Why not Lightning's own DDP launcher: it re-runs ``sys.argv`` in each child process, so under a
Hydra multirun (``-m``) every child starts a sweep of its own (lightning-hydra-template #393,
hydra #2070). Instead, the Hydra job (single run or one job of a sweep) starts
``python -m torch.distributed.run --nproc-per-node=N train.py <this job's overrides>
hydra.run.dir=<this job's dir>``: the ranks compose exactly this job's config as a single run,
in this job's dir; Lightning sees a torchelastic environment and launches nothing itself; rank 0
writes metrics.json; and the sweep goes on to its next job when the ranks exit. One code path
serves single runs and sweeps.

Already inside torchrun (LOCAL_RANK set), under SLURM with one task per rank, or for one process,
nothing is launched: the job runs in this process.

``runtime.allocator=jemalloc|tcmalloc`` also needs a fresh process: the allocator must be preloaded
(LD_PRELOAD) before Python starts. The job is then re-launched the same way (one plain child
process, or torchrun's ranks) with the library preloaded; metrics.json records which allocator the
process really has mapped.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional

from trainer.console import QUIET_ENV
from trainer.errors import ConfigError
from trainer.launch import stopping
from trainer.launch.torchrun import FIRST_FAILURE, LAUNCHED_RANKS_ENV, STOP_GRACE_ENV
from trainer.measure import hardware, metrics
from trainer.paths import ROOT
from trainer.rank import is_launched_rank, srun_task

log = logging.getLogger(__name__)

DISTRIBUTED = ("ddp", "fsdp", "fsdp2")


def inside_launcher() -> bool:
    """True when some launcher (torchrun, Lightning, srun with several tasks) already started this
    process as a rank.

    srun's tasks are told by the job step's own variables (``rank.srun_task``), not by
    ``SLURM_NTASKS``: a batch script's (or salloc's) own shell has ``SLURM_NTASKS`` of the whole job
    too, and ``python train.py strategy=ddp devices=2`` run there, without srun, is one process that
    must start its ranks (it waited forever for a second rank nothing would start)."""
    if is_launched_rank() or "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    return srun_task()


def processes_per_node(cfg) -> int:
    devices = cfg.devices
    if isinstance(devices, int) and devices > 0:
        return devices
    if cfg.accelerator != "cpu":
        try:
            import torch  # lazy: no torch before a job starts (trainer/__init__.py)

            if torch.cuda.is_available():
                return torch.cuda.device_count()
        except Exception:
            pass
    return 1


ALLOCATOR_LIBS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so"),
}
_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/lib/x86_64-linux-gnu",
)


def find_allocator(name: str) -> str | None:
    for directory in _LIB_DIRS:
        for lib in ALLOCATOR_LIBS.get(name, ()):
            path = os.path.join(directory, lib)
            if os.path.exists(path):
                return path
    return None


_ALLOCATOR_OF: dict = {}  # pid -> allocator_loaded()'s answer


def allocator_loaded() -> str:
    """Which malloc this process really uses: jemalloc or tcmalloc if mapped, else the C library's.

    Read once per process (the malloc is chosen when the process starts): reading /proc/self/maps
    took 2.7 ms, and metrics.json's journal asks at every epoch end, while the GPU waits for the next
    epoch's first step."""
    pid = os.getpid()
    if pid not in _ALLOCATOR_OF:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return "unknown"
        _ALLOCATOR_OF[pid] = next((name for name in ALLOCATOR_LIBS if f"lib{name}" in maps), "default")
    return _ALLOCATOR_OF[pid]


# set in the allocator's relaunched child (``allocator_env``): which allocator it was started to preload
ALLOCATOR_RELAUNCHED_ENV = "TRAINER_ALLOCATOR_RELAUNCHED"


def allocator_env(cfg) -> dict:
    """Environment that preloads runtime.allocator (empty when it is already loaded or default)."""
    name = cfg.runtime.allocator
    if name == "default" or allocator_loaded() == name:
        return {}
    if os.environ.get(ALLOCATOR_RELAUNCHED_ENV) == name:
        raise ConfigError(
            f"'runtime.allocator={name}': preloading {find_allocator(name)} did not take effect (LD_PRELOAD ignored?)."
        )
    path = find_allocator(name)
    if path is None:
        package = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}[name]
        raise ConfigError(
            f"'runtime.allocator={name}': no {' or '.join(ALLOCATOR_LIBS[name])} found in {', '.join(_LIB_DIRS[:3])} .... "
            f"Install it (Debian/Ubuntu: apt-get install {package}) or use runtime.allocator=default."
        )
    preload = " ".join(filter(None, [path, os.environ.get("LD_PRELOAD")]))
    return {"LD_PRELOAD": preload, ALLOCATOR_RELAUNCHED_ENV: name}


def settle_strategy(cfg) -> None:
    """``strategy=auto`` with more than one process (``devices=2``, ``-1`` or ``auto`` on a machine with
    several GPUs, ``num_nodes=2``) is DDP, as Lightning would choose it; the job's config says so from
    here on. Left to Lightning, its own launcher re-ran the command line in its children: every
    process printed the job's banner and results, each took all of the node's cores for its threads,
    and under ``-m`` each child started a sweep of its own. As ``strategy=ddp`` the job's ranks are
    torchrun's (``launch``), with the DDP settings, the threads per rank and the checks of a DDP run.
    """
    processes = processes_per_node(cfg) * int(cfg.num_nodes)
    if cfg.strategy == "auto" and processes > 1:
        from omegaconf import open_dict  # lazy: keeps omegaconf out of train.py's start-up

        with open_dict(cfg):
            cfg.strategy = "ddp"
        if not is_launched_rank():
            log.info("strategy=auto with %d processes: DDP (strategy=ddp)", processes)


def refuse_nodes_without_a_launcher(cfg) -> None:
    """``num_nodes`` above 1 needs a launcher on every node (torchrun's agents, or srun's tasks), or a
    cluster Lightning meets the other nodes in by itself (``NODE_RANK`` and ``MASTER_ADDR`` set on each
    node, MPI's or LSF's launchers): started as a plain process, Lightning's own launcher waited forever
    for the other nodes' ranks, saying nothing."""
    clusters = ("NODE_RANK", "MASTER_ADDR", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "LSB_JOBID")
    if int(cfg.num_nodes) > 1 and not inside_launcher() and not any(k in os.environ for k in clusters):
        raise ConfigError(
            f"'num_nodes={cfg.num_nodes}' needs its processes started on every node, by torchrun or by Slurm's srun; "
            "started as a plain process, it would wait forever for the other nodes. Run it under torchrun on each "
            f"node (torchrun --nnodes={cfg.num_nodes} --nproc-per-node=<devices> --node-rank=<this node> "
            "--master-addr=<first node> --master-port=29500 train.py ...), or as a Slurm job "
            "(scripts/slurm/train.sbatch, hydra/launcher=slurm); or use num_nodes=1 here."
        )


def launches_ranks(cfg) -> bool:
    """Whether this process starts the job's ranks itself: one node, several processes, no launcher yet."""
    return cfg.strategy in DISTRIBUTED and processes_per_node(cfg) > 1 and cfg.num_nodes == 1 and not inside_launcher()


def needs_launch(cfg) -> bool:
    return launches_ranks(cfg) or bool(allocator_env(cfg))


def leave_process_group() -> None:
    """A rank leaves its process group before the interpreter exits.

    Lightning's DDP teardown keeps the group alive. A gloo rank that exits with it still up was seen
    to abort at interpreter exit ("terminate called without an active exception", SIGABRT) after
    its job had finished and written an ok metrics.json, which made torchrun, and the sweep, fail.
    """
    if "torch.distributed" not in sys.modules:  # nothing trained here (--help, --cfg): do not import torch
        return
    import torch.distributed as dist  # lazy: no torch before a job starts (trainer/__init__.py)

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_launched_rank(code) -> None:
    """A launched rank (torchrun's) ends here, with ``code``, without the interpreter's teardown.

    Destroying the process group is not always enough: a gloo rank was still seen to abort at exit
    (SIGABRT, "terminate called without an active exception": a c10d/gloo thread object destroyed
    while still joinable during C++ static destruction), about one run in three of a 2-rank FSDP2
    test, after its job had finished and written everything. Its results are on disk by now
    (metrics.json, checkpoints, TensorBoard's files: all closed by Lightning's teardown), so the
    rank flushes its logs and leaves with ``os._exit``, which skips that destruction.
    """
    if not is_launched_rank() or "torch.distributed" not in sys.modules:
        return
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)  # sys.exit("message") prints its message; keep that
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg, out_dir: str, overrides: List[str], quiet: bool = False, env: Optional[dict] = None) -> int:
    """Run this job in fresh processes (torchrun's ranks, or one child for the allocator); return the exit code.

    ``quiet``: a sweep's job; its processes keep the console to warnings and errors. ``env``: more for
    them (the switches' plan the launching process resolved).
    """
    job = [str(ROOT / "train.py"), *job_overrides(cfg, out_dir, overrides)]
    extra_env = {**allocator_env(cfg), **(env or {})}
    if launches_ranks(cfg):
        extra_env.update(ranks_env(cfg))
        nproc = processes_per_node(cfg)
        stale = os.path.join(out_dir, "ranks", FIRST_FAILURE)  # an earlier launch's (this one resumes it)
        if os.path.exists(stale):
            os.remove(stale)
        # trainer.torchrun: torchrun, with a failed rank's own message instead of the launcher's traceback
        cmd = [
            sys.executable,
            "-m",
            "trainer.torchrun",
            os.path.join(out_dir, "ranks"),
            f"--nproc-per-node={nproc}",
            "--nnodes=1",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            *job,
        ]
    else:
        cmd = [sys.executable, *job]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
        **extra_env,
    )
    if quiet:
        env[QUIET_ENV] = "1"
    log.info("launching: %s%s", f"LD_PRELOAD={env['LD_PRELOAD']} " if "LD_PRELOAD" in env else "", " ".join(cmd))
    from trainer.launch.slurm import submitit_stop_handler  # lazy: keeps omegaconf out of train.py's start-up

    # a submitit job's own handlers would requeue it at once (SIGUSR2) or ignore the signal (SIGTERM):
    # the stop signals are ours until the processes stopped, and then slurm.hand_launched_job_to_submitit's
    submitit_job = submitit_stop_handler() is not None
    installed = submitit_job and stopping.install(also=(stopping.SUBMITIT_SIGNAL,))
    started = time.time()
    try:
        code = _wait_forwarding_stop(_start(cmd, env, hold_submitit_signal=submitit_job))
    finally:
        if installed:
            stopping.uninstall()
    return _preempted_code(code, out_dir, started)


def _start(cmd: List[str], env: dict, hold_submitit_signal: bool) -> subprocess.Popen:
    """Start the job's processes; in a submitit job, with submitit's SIGUSR2 blocked in them (and in
    every process they start: a blocked signal stays blocked across fork and exec). Slurm sends it to
    every process of the job, and Python's default for it ends a process at once, unsaved: this
    process passes the stop on instead (``_wait_forwarding_stop``). Blocked only while the child
    starts: one sent meanwhile reaches this process once it is unblocked, none is lost."""
    if not hold_submitit_signal:
        return subprocess.Popen(cmd, env=env)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {stopping.SUBMITIT_SIGNAL})
    try:
        return subprocess.Popen(cmd, env=env)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


# What the job's processes get for a stop signal this process got: the same one, but for submitit's
# SIGUSR2, which they hold blocked (``_start``): SIGUSR1, the time-limit stop they know
PASSED_ON = {"SIGUSR2": "SIGUSR1"}


def ranks_env(cfg) -> dict:
    """What torchrun's agent and the ranks get besides this process's environment: the seconds the
    agent waits for the ranks to save after a stop signal, each rank's share of the node's cores as
    ``OMP_NUM_THREADS`` where the user set none (torchrun would set 1, which a rank reads as the
    user's bound on its intra-op threads: ``switchboard.set_intra_op_threads``), and the mark that
    this framework started them (``LAUNCHED_RANKS_ENV``: their ``OMP_NUM_THREADS`` is never torchrun's)."""
    env = {STOP_GRACE_ENV: str(stop_grace_s(cfg)), LAUNCHED_RANKS_ENV: "1"}
    if "OMP_NUM_THREADS" not in os.environ:
        share = hardware.cores_per_process(hardware.usable_cores(), processes_per_node(cfg))
        env["OMP_NUM_THREADS"] = str(max(1, share))
    return env


def job_overrides(cfg, out_dir: str, overrides: List[str]) -> List[str]:
    """The command line of the job's processes: its own overrides, its dir, and the checkpoint it
    resumes from where the launching process decided that itself (a stopped sweep's job taken up
    again: ``ckpt_path=last`` on the job's config, not on its command line), so the ranks resume too."""
    kept = [
        o for o in overrides if not o.lstrip("+~").startswith(("hydra.run.dir", "hydra.sweep.dir", "hydra.job.num"))
    ]
    if cfg.get("ckpt_path") and not any(o.lstrip("+~").startswith("ckpt_path=") for o in kept):
        kept.append(f"ckpt_path={cfg.ckpt_path}")
    return [*kept, f"hydra.run.dir={out_dir}"]


def stop_grace_s(cfg) -> int:
    """The seconds the ranks get after a stop signal to save (torchrun's agent then sends SIGKILL):
    ``checkpoint.stop_grace_s``, or Slurm's own grace for this job where that is longer, so that
    Slurm, not the agent, ends a stop that takes that long."""
    from trainer.launch.slurm import grace_s  # lazy: keeps omegaconf out of train.py's start-up

    return max(int(cfg.checkpoint.stop_grace_s), grace_s() or 0)


def _preempted_code(code: int, out_dir: str, started: float) -> int:
    """A stop signal's exit code as one process gives it: 75 once the ranks saved. torchrun's agent,
    signalled itself, passes the signal to its ranks, waits for them, and exits with 128 + the signal's
    number whether or not they saved; their record (rank 0's metrics.json, written by this launch) says."""
    name = stopping.requested()
    if not name or code != 128 + int(signal.Signals[PASSED_ON.get(name, name)]):
        return code
    path = os.path.join(out_dir, "metrics.json")
    try:
        record = metrics.read(path) if os.path.getmtime(path) >= started else {}
    except (OSError, ValueError):
        return code
    return stopping.PREEMPTED_EXIT_CODE if record.get("preempted") else code


def _wait_forwarding_stop(proc: subprocess.Popen) -> int:
    """Wait for the job's processes; a SIGTERM/SIGUSR1 this process gets (``trainer.launch.stopping``) is
    passed on to torchrun's agent, which passes it to every rank: they save and stop too, within
    ``stop_grace_s``. The ranks run in sessions of their own (torchrun starts them so), so no signal
    reaches them but the agent's. Ctrl-C in a terminal reaches this process and the agent together
    (one foreground process group) and is not passed on again: a second SIGINT at the agent is a
    second Ctrl-C, which ends the ranks at once (``trainer.launch.torchrun``).

    The exit status is the shell's: a process a signal killed (the allocator's one child) gives 128 +
    the signal's number, as torchrun's agent does; Python's negative code passed to ``sys.exit`` came
    out as 256 less the number (244 for SIGUSR2, 247 for SIGKILL)."""
    forwarded = False
    while True:
        try:
            code = proc.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            name = stopping.requested()
            if name and name != "SIGINT" and not forwarded:
                passed = PASSED_ON.get(name, name)
                if passed != name:
                    log.warning("%s received: passing %s on to the job's processes, which save and stop", name, passed)
                proc.send_signal(signal.Signals[passed])
                forwarded = True
        except KeyboardInterrupt:
            # a second Ctrl-C: the terminal sent it to the job's process too, which ends at once
            code = proc.wait()
            break
    return 128 - code if code < 0 else code
