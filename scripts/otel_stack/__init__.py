"""The collector + Jaeger stack without Docker: the shipped configs, run from Go-built binaries.

No Docker engine runs on the build machines, so the stack runs the same files
docker-compose.yml mounts (``collector/otel-collector.yaml``, ``collector/jaeger.yaml``)
with binaries built from the Go module proxy and cached outside the clone, on free
loopback ports. Only ports (and the tail-sampling knobs) are substituted, through the
``${env:...}`` references in those files.

- :mod:`scripts.otel_stack.binaries` builds and caches the binaries;
- :mod:`scripts.otel_stack.stack` starts/stops the processes and reads traces back from Jaeger;
- ``scripts/stack.py`` is the CLI for people (``make stack-up``), ``.ci/run`` builds through it,
  and ``tests/stack/fixtures.py`` is the pytest plugin over it.

Standard library only: it runs before any venv exists.
"""
