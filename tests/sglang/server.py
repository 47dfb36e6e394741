"""``python -m sglang.launch_server`` with the test model on the CPU (shared by the tests and
``scripts/sglang-gpu-check --cpu-dry-run``); stdlib only."""

from __future__ import annotations

from pathlib import Path

from tests.vllm import serve_driver

#: SGLang's CPU path: the model runs in the scheduler process with torch's native attention
#: backend (the test model never calls it), float32, no CUDA graphs, no warm-up request.
CPU_ARGS = ["--device", "cpu", "--load-format", "dummy", "--attention-backend", "torch_native",
            "--disable-cuda-graph", "--dtype", "float32", "--skip-server-warmup"]
#: Imports of torch + SGLang in three processes on two shared cores take 1-2 minutes.
START_TIMEOUT_S = 420.0


def launch(python: str, model: Path | str, *, env: dict[str, str], log_path: Path, extra_args: list[str],
           timeout_s: float = START_TIMEOUT_S) -> serve_driver.Server:
    port = serve_driver.free_port()
    command = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--served-model-name", "tiny",
               "--host", "127.0.0.1", "--port", str(port), *extra_args]
    return serve_driver.start_command(command, port, env=env, log_path=log_path, timeout_s=timeout_s,
                                      what="sglang.launch_server")
