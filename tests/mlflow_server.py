"""A real MLflow tracking server on 127.0.0.1 for the tests: SQLite backend, local artifact root.

The server runs from its own venv (``make test`` builds ``.venv-mlflow-server`` from
``constraints-mlflow-server.txt``: the server pins an older pyarrow than the product), or from the
``mlflow`` executable named by ``TRAINER_TEST_MLFLOW_SERVER``. Started in its own process group,
bounded in time, stopped by PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent


def executable() -> Optional[str]:
    given = os.environ.get("TRAINER_TEST_MLFLOW_SERVER")
    candidate = Path(given) if given else ROOT / ".venv-mlflow-server" / "bin" / "mlflow"
    return str(candidate) if candidate.is_file() else None


def _free_port() -> int:
    import socket

    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    def __init__(self, workdir: Path, mlflow: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "mlflow-server.log", "w")
        self.proc = subprocess.Popen(
            [
                mlflow, "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
                "--default-artifact-root", str(workdir / "artifacts"),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # tracking only: MLflow 3's server also starts seven job-runner processes by default, which
            # took both cores for about 15 s after it answered (the tests use no server-side jobs)
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
        )  # fmt: skip
        self._wait_ready(timeout=90)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer on {self.uri} within {timeout} s; see {self.log.name}")

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # gunicorn/uvicorn workers are in its group
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self.log.close()
