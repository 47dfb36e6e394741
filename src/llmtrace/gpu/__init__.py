"""GPU telemetry: an NVML sampler service, GPU state on spans, energy per step,
CUDA-event forward timing, ``hw.gpu.*`` metrics and ``llmtrace doctor``.

Nothing here runs on the serving hot path: the sampler thread calls NVML, and span
builders read its ring buffer when they materialise spans. Importing this package
imports neither pynvml nor torch. See docs/gpu.md.

Entry points:

* :func:`~llmtrace.gpu.sampler.start_sampler` / ``get_sampler`` / ``stop_sampler`` — the
  process's :class:`~llmtrace.gpu.sampler.GpuSampler`;
* ``GpuSampler.span_attributes(start_ns, end_ns)`` and ``GpuSampler.energy_j(...)``,
  :func:`~llmtrace.gpu.sampler.split_energy_by_tokens`;
* :func:`~llmtrace.gpu.metrics.register_gpu_metrics`;
* :class:`~llmtrace.gpu.cuda_timing.ForwardTimer`,
  :func:`~llmtrace.gpu.cuda_timing.torch_memory_attributes`;
* :func:`~llmtrace.gpu.doctor.collect` and ``render``: the report of ``llmtrace doctor``.
"""
