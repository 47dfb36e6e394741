"""One package per patched library; each defines ``INSTRUMENTOR`` (see ``_base.Instrumentor``)."""
