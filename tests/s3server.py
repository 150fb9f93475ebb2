"""A real S3 API on 127.0.0.1 for the tests: moto's server mode, with authentication on.

``INITIAL_NO_AUTH_ACTION_COUNT`` lets the first three requests through unsigned-checked: they make
an IAM user, its allow-all policy and its access key; from then on the server checks every
request's signature against that key, so a wrong key is refused as a real S3 endpoint would.
Started in its own process group, bounded in time, stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import closing


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, log_path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3", AWS_DEFAULT_REGION="us-east-1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self._wait_ready(timeout=60)
        self.key, self.secret = self._make_user()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with closing(socket.create_connection(("127.0.0.1", self.port), timeout=0.5)):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not listen on {self.port} within {timeout} s")

    def _make_user(self):
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="trainer")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def env(self, **override) -> dict:
        """The standard AWS variables a user would set for this endpoint."""
        env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        env.update(override)
        return env

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(key=self.key, secret=self.secret, endpoint_url=self.endpoint, skip_instance_cache=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()
