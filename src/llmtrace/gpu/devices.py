"""Which GPUs this process uses: ``CUDA_VISIBLE_DEVICES`` -> NVML handles.

NVML numbers devices physically (the ``nvidia-smi`` index); CUDA numbers them in the
order ``CUDA_VISIBLE_DEVICES`` lists them. The rules below are CUDA's own (as documented
by NVIDIA and re-implemented by ``torch.cuda._parse_visible_devices``):

* unset -> every GPU, in NVML order;
* entries are integer indices (parsed like ``strtoul``: ``"1gpu"`` is 1), ``GPU-<uuid>``
  or ``MIG-<uuid>`` (R470+) or the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``;
* a UUID may be abbreviated to any prefix that matches exactly one device;
* the first invalid entry (negative, out of range, unknown or ambiguous UUID) ends the
  list — the devices before it stay visible;
* the same device named twice makes *no* device visible;
* an empty value (or ``NoDevFiles``) hides every device.

Entries may mix indices and UUIDs; CUDA accepts that, torch's parser does not.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmtrace.gpu.backend import NvmlBackend

__all__ = ["GpuDevice", "parse_cuda_visible_devices", "resolve_devices"]

_log = logging.getLogger("llmtrace.gpu")

_GPU_PREFIX = "GPU-"
_MIG_PREFIX = "MIG-"
_LEGACY_MIG_PREFIX = "MIG-GPU-"


@dataclass(frozen=True)
class GpuDevice:
    """One device the sampler reads.

    ``device_id`` is what spans and metrics carry as ``hw.gpu.id``: the physical
    (``nvidia-smi``) index, ``"<gpu>:mig<slot>"`` for a MIG instance. It is stable on a
    host, unlike the CUDA ordinal, which every worker process sees as 0.
    """

    visible_index: int  # CUDA ordinal in this process (cuda:N)
    nvml_index: int  # physical index of the GPU (the parent GPU for MIG)
    device_id: str
    uuid: str
    name: str
    is_mig: bool = False
    handle: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class _Known:
    nvml_index: int
    device_id: str
    uuid: str
    name: str
    handle: object
    is_mig: bool = False
    mig_ids: tuple[int, int] | None = None
    parent_uuid: str = ""


def _strtoul(text: str) -> int:
    """Leading digits of ``text`` as CUDA reads them; -1 when there are none or a sign is ``-``."""
    text = text.strip()
    digits = ""
    for pos, char in enumerate(text):
        if char.isdigit():
            digits += char
        elif not (pos == 0 and char == "+"):
            break
    if not digits or text.startswith("-"):
        return -1
    return int(digits)


def parse_cuda_visible_devices(value: str | None) -> list[int | str] | None:
    """Split ``CUDA_VISIBLE_DEVICES`` into ordinals and UUID strings.

    ``None`` means unset (all devices). Stops at the first negative index. Duplicates
    are not checked here — they are only detectable after UUID prefixes are resolved.
    """
    if value is None:
        return None
    out: list[int | str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.upper().startswith((_GPU_PREFIX, _MIG_PREFIX)):
            out.append(entry)
            continue
        index = _strtoul(entry)
        if index < 0:
            break
        out.append(index)
    return out


def _inventory(backend: NvmlBackend, with_mig: bool) -> list[_Known]:
    known: list[_Known] = []
    for index in range(backend.device_count()):
        handle = backend.handle_by_index(index)
        uuid = backend.uuid(handle)
        name = backend.name(handle)
        known.append(_Known(index, str(index), uuid, name, handle))
        if not with_mig:
            continue
        for slot, mig in enumerate(backend.mig_handles(handle)):
            try:
                ids = backend.mig_ids(mig)
            except Exception:  # noqa: BLE001 - a MIG slot we cannot name is still addressable by UUID
                ids = None
            known.append(_Known(index, f"{index}:mig{slot}", backend.uuid(mig), name, mig, True, ids, uuid))
    return known


def _match_uuid(entry: str, known: Sequence[_Known]) -> _Known | None:
    """Unique-prefix match of a ``GPU-``/``MIG-`` entry, or ``None`` (unknown or ambiguous)."""
    if entry.upper().startswith(_LEGACY_MIG_PREFIX):
        return _match_legacy_mig(entry, known)
    want_mig = entry.upper().startswith(_MIG_PREFIX)
    wanted = entry.lower()
    hits = [k for k in known if k.is_mig == want_mig and k.uuid.lower().startswith(wanted)]
    return hits[0] if len(hits) == 1 else None


def _match_legacy_mig(entry: str, known: Sequence[_Known]) -> _Known | None:
    """``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470)."""
    parts = entry[len(_MIG_PREFIX) :].split("/")
    if len(parts) != 3:
        return None
    gpu_uuid, gi, ci = parts[0].lower(), _strtoul(parts[1]), _strtoul(parts[2])
    hits = [k for k in known if k.is_mig and k.parent_uuid.lower().startswith(gpu_uuid) and k.mig_ids == (gi, ci)]
    return hits[0] if len(hits) == 1 else None


def _resolve_entries(entries: Sequence[int | str], known: Sequence[_Known]) -> list[_Known]:
    gpus = [k for k in known if not k.is_mig]
    chosen: list[_Known] = []
    for entry in entries:
        hit = (gpus[entry] if entry < len(gpus) else None) if isinstance(entry, int) else _match_uuid(entry, known)
        if hit is None:
            break  # CUDA: the first invalid entry ends the list
        if hit in chosen:
            return []  # CUDA: a repeated device makes the whole list invalid
        chosen.append(hit)
    return chosen


def _select(devices: list[GpuDevice], selection: Sequence[int | str]) -> list[GpuDevice]:
    picked: list[GpuDevice] = []
    for item in selection:
        for dev in devices:
            matches = (
                dev.visible_index == item
                if isinstance(item, int)
                else item in (dev.device_id, dev.uuid) or dev.uuid.lower().startswith(item.lower())
            )
            if matches and dev not in picked:
                picked.append(dev)
                break
    return picked


def resolve_devices(
    backend: NvmlBackend,
    selection: str | Sequence[int | str] = "visible",
    environ: Mapping[str, str] | None = None,
) -> list[GpuDevice]:
    """The devices to sample, ordered by CUDA ordinal.

    ``selection``: ``"visible"`` (default: the devices ``CUDA_VISIBLE_DEVICES`` gives this
    process), ``"all"`` (every physical GPU, ignoring the variable), or a sequence of CUDA
    ordinals / device ids / UUID prefixes picked out of the visible devices.
    """
    env = os.environ if environ is None else environ
    entries = None if selection == "all" else parse_cuda_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    with_mig = entries is not None and any(isinstance(e, str) and e.upper().startswith(_MIG_PREFIX) for e in entries)
    known = _inventory(backend, with_mig)
    chosen = [k for k in known if not k.is_mig] if entries is None else _resolve_entries(entries, known)
    devices = [
        GpuDevice(ordinal, k.nvml_index, k.device_id, k.uuid, k.name, k.is_mig, k.handle)
        for ordinal, k in enumerate(chosen)
    ]
    if isinstance(selection, str):
        return devices
    return _select(devices, selection)
