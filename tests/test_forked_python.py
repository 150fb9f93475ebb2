"""The tests' forked ``python`` (forked_python.py) gives what a fresh interpreter gives: the same exit
code, stdout and stderr for scripts and ``-m`` modules that exit, fail, print a traceback or run exit
handlers, and for ``train.py`` itself."""

from __future__ import annotations

import textwrap

import pytest
from conftest import ROOT, clean_env
from forked_python import _forkable, run_python

SCRIPT = textwrap.dedent(
    """
    import atexit, os, sys
    atexit.register(lambda: print("exit handler ran", flush=True))
    print("argv", sys.argv[1:], "path0", os.path.basename(sys.path[0]), "cwd", os.path.basename(os.getcwd()))
    print("env", os.environ.get("TRAINER_CACHE"), "name", __name__)
    print("to stderr", file=sys.stderr)
    how = sys.argv[1]
    if how == "code":
        sys.exit(3)
    if how == "message":
        sys.exit("a one-paragraph error")
    if how == "raise":
        raise ValueError("boom")
    """
)


@pytest.mark.parametrize("how", ["ok", "code", "message", "raise"])
def test_a_forked_script_runs_as_a_fresh_interpreter_runs_it(tmp_path, how):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "probe.py").write_text(SCRIPT)
    env = clean_env(TRAINER_CACHE=str(tmp_path / "cache"))
    args = ["scripts/probe.py", how]
    assert _forkable(args, env)
    forked, fresh = run_python(args, tmp_path, env), run_python(args, tmp_path, env, fresh=True)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.returncode == {"ok": 0, "code": 3, "message": 1, "raise": 1}[how]
    assert "exit handler ran" in forked.stdout and "path0 scripts" in forked.stdout and "name __main__" in forked.stdout
    if how == "raise":  # a traceback's file paths and lines are the same; only the runpy frames differ
        assert "Traceback" in forked.stderr and forked.stderr.endswith("ValueError: boom\n")
    else:
        assert forked.stderr == fresh.stderr


def test_train_py_and_a_module_give_the_same_output_forked(tmp_path):
    env = clean_env()
    for args in ([str(ROOT / "train.py"), "--help"], ["-m", "trainer.report", str(tmp_path / "nope")]):
        forked, fresh = run_python(args, ROOT, env), run_python(args, ROOT, env, fresh=True)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode != 0 and "nope" in fresh.stderr  # the report's error on a missing dir


def test_an_environment_read_at_import_gets_a_fresh_interpreter():
    base = clean_env()
    assert _forkable(["train.py"], base)
    run_python(["-c", "pass"], ROOT, base)  # (a -c command is never forked)
    run_python(["-m", "trainer.report", "--help"], ROOT, base)  # the server is up with this environment
    assert _forkable(["train.py"], {**base, "WANDB_MODE": "offline"})
    assert not _forkable(["train.py"], {**base, "OMP_NUM_THREADS": "1"})
    assert not _forkable(["train.py"], {**base, "LD_PRELOAD": "libjemalloc.so.2"})


def test_a_forked_command_sees_multiprocessing_as_a_fresh_interpreter_does(tmp_path):
    """A loader's workers start as they would (the platform's default, fork on Linux), not through the
    tests' server, whose children cannot take a dataset defined inside a function."""
    (tmp_path / "mp.py").write_text(
        "import multiprocessing as mp\n"
        "print(mp.get_start_method(allow_none=True), mp.current_process().name, mp.parent_process())\n"
        "if __name__ == '__main__':\n"
        "    def local(): return 7\n"
        "    ctx = mp.get_context()\n"
        "    p = ctx.Process(target=local); p.start(); p.join(); print('child', p.exitcode)\n"
    )
    env = clean_env()
    forked, fresh = run_python(["mp.py"], tmp_path, env), run_python(["mp.py"], tmp_path, env, fresh=True)
    assert forked.stdout == fresh.stdout == "None MainProcess None\nchild 0\n", (forked.stdout, forked.stderr)


def test_a_forked_command_dies_with_its_caller(tmp_path):
    """trainer/launch/preloaded.py's die_with_parent (the tuner's probes): a caller that dies without cleaning up
    (a tune killed with SIGKILL) takes the preloaded server and the command with it, though the
    command inherited the server's "alive" pipe."""
    import os
    import subprocess
    import sys
    import time

    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(300)\n")
    caller = textwrap.dedent(
        f"""
        import os
        from trainer.launch import preloaded
        child = preloaded.start(["sleeper.py"], {str(tmp_path)!r}, dict(os.environ), new_session=True, die_with_parent=True)
        open("pid", "w").write(str(child.pid))
        time_left = 50
        while not os.path.exists("/proc/%d" % child.pid) and time_left:
            time_left -= 1
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", caller], cwd=tmp_path, env=clean_env(), timeout=120, check=True)
    pid = int((tmp_path / "pid").read_text())

    def alive() -> bool:
        try:
            return open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.time() + 30
    while alive() and time.time() < deadline:
        time.sleep(0.2)
    survived = alive()
    if survived:
        os.kill(pid, 9)
    assert not survived, f"the forked command {pid} outlived its caller"


@pytest.mark.parametrize("fresh", [False, True])
def test_a_command_past_its_timeout_reports_every_process_stack_and_ends_its_whole_tree(tmp_path, capfd, fresh):
    """hang_report.end_hung: a hung run's failure says where each of its processes waited (a rank, a loader
    worker), and leaves none of them running: here a command and the grandchild it starts, both asleep."""
    import subprocess

    import psutil

    (tmp_path / "grandchild.py").write_text(
        "import time\n\ndef waits_in_the_grandchild():\n    time.sleep(300)\n\nwaits_in_the_grandchild()\n"
    )
    (tmp_path / "hangs.py").write_text(
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, 'grandchild.py'])\n"
        "open('grandchild.pid', 'w').write(str(g.pid))\n"
        "def waits_in_the_command():\n    time.sleep(300)\n\nwaits_in_the_command()\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["hangs.py"], tmp_path, clean_env(), timeout=4, fresh=fresh)
    report = capfd.readouterr().err
    assert "waits_in_the_command" in report and "waits_in_the_grandchild" in report, report[-3000:]
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
