"""The real test stack: the shipped collector config and Jaeger v2, run from Go-built binaries.

No Docker engine runs on the build machines, so the tests run the same files
docker-compose.yml mounts (``collector/otel-collector.yaml``, ``collector/jaeger.yaml``)
with binaries built from the Go module proxy and cached outside the clone, on free
loopback ports. Only ports (and the tail-sampling knobs) are substituted, through the
``${env:...}`` references in those files.

- :mod:`tests.stack.binaries` builds and caches the binaries;
- :mod:`tests.stack.stack` starts/stops the processes and reads traces back from Jaeger;
- :mod:`tests.stack.fixtures` is the pytest plugin (``otel_stack`` and friends);
- ``scripts/stack.py`` is the same thing as a CLI for people.
"""
