"""What is installed: importable modules, the Transformer Engine version, the GPUs (rules of the environment and
of fine-grained offload depend on them), and ``machine_facts``: all the validator reads from the machine, which the
cache of validations (fast_check/store.py) is keyed by."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def te_version() -> str | None:
    """Installed Transformer Engine version, or None when it cannot be imported."""
    if not module_available("transformer_engine"):
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("transformer-engine", "transformer_engine"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def version_tuple(text: str) -> tuple[int, ...]:
    """``2.10.0`` -> (2, 10, 0): the digits of the first three parts, for comparing versions."""
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def cuda_available() -> bool:
    """Whether this machine has a CUDA device torch can use (the GPU checks of Megatron Bridge's validate() need one)."""
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver is no device to check against
        return False


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver reports it: what a check of the GPU's architecture reads."""

    name: str
    memory_bytes: int
    capability: tuple[int, int]  # CUDA compute capability (9, 0) for Hopper


@dataclass(frozen=True)
class DeviceFacts:
    """The machine's GPUs as the driver reports them, every one whatever CUDA_VISIBLE_DEVICES says (that variable is
    part of the environment, keyed apart), the driver's version and the CUDA build of the installed PyTorch. What
    torch.cuda.is_available() and get_device_properties() answer, and so every check of the GPU the validator or
    Megatron Bridge's validate() makes, follows from these and the environment."""

    gpus: tuple[Gpu, ...] = ()
    driver: str = ""  # "" without an NVIDIA driver
    torch_cuda: str = ""  # the CUDA version the installed PyTorch was built for; "" for a CPU build or no PyTorch


def _nvml_gpus() -> tuple[tuple[Gpu, ...], str]:
    """The GPUs and driver version read through NVML (the driver's own library, as nvidia-smi reads them): no CUDA
    context is made, nothing heavy imported. No driver: no GPUs."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return (), ""
    if nvml.nvmlInit_v2() != 0:
        return (), ""
    try:
        driver = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(driver, ctypes.c_uint(96)) != 0:
            driver.value = b"unknown"
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return (), driver.value.decode(errors="replace")

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                gpus.append(Gpu(name=f"unreadable device {index}", memory_bytes=0, capability=(0, 0)))
                continue
            name, memory = ctypes.create_string_buffer(96), Memory()
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            nvml.nvmlDeviceGetName(handle, name, ctypes.c_uint(96))
            nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
            nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
            gpus.append(Gpu(name=name.value.decode(errors="replace"), memory_bytes=int(memory.total),
                            capability=(major.value, minor.value)))
        return tuple(gpus), driver.value.decode(errors="replace")
    finally:
        nvml.nvmlShutdown()


def _torch_cuda_build() -> str:
    """torch.version.cuda, read from the installed torch/version.py without importing PyTorch (about 3 s)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.submodule_search_locations:
        return ""
    for folder in spec.submodule_search_locations:
        try:
            text = (Path(folder) / "version.py").read_text()
        except OSError:
            continue
        found = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]*)['\"]", text, re.MULTILINE)
        return found.group(1) if found else ""
    return ""


@functools.lru_cache(maxsize=None)
def device_facts() -> DeviceFacts:
    """This machine's GPUs, driver and PyTorch CUDA build (read once per process)."""
    gpus, driver = _nvml_gpus()
    return DeviceFacts(gpus=gpus, driver=driver, torch_cuda=_torch_cuda_build())


@functools.lru_cache(maxsize=None)
def importable_modules() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What can be imported from each installation folder on sys.path: its top-level module names and the
    distributions installed there (name and version, as their .dist-info folders are named). The rules ask whether a
    module is importable (APEX's fused kernels, nvidia-resiliency-ext, fast-hadamard-transform, mlflow, ...) and
    Megatron Core's checks ask the same of their optional kernels: any installed or removed package changes this.
    Folders holding no installed distribution (the working folder, the script's) are left out: a file written there
    between two commands is not a package installed."""
    listed: dict[Path, list[str]] = {}
    for entry in sys.path:
        folder = Path(entry or ".").resolve()
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        if any(name.endswith((".dist-info", ".egg-info", ".egg-link")) for name in names):
            listed.setdefault(folder, names)
    out = []
    for folder, names in listed.items():
        # an installation folder inside another holds a package's own vendored copies, put on sys.path by importing
        # that package (importing setuptools adds setuptools/_vendor): the same installation before and after
        if any(other in folder.parents for other in listed):
            continue
        # not __pycache__ or hidden folders: Python writes the first when it first imports a module of the folder (a
        # fresh environment's first command), which would give the next command another key for the same packages
        modules = tuple(name for name in names
                        if name.endswith((".dist-info", ".egg-info", ".egg-link", ".pth", ".py", ".so"))
                        or ((folder / name).is_dir() and name != "__pycache__" and not name.startswith(".")))
        out.append((str(folder), modules))
    return tuple(out)


@dataclass(frozen=True)
class MachineFacts:
    """Everything the validator reads from the machine, besides the environment and the config: the GPUs and the
    packages importable. Two machines that differ in any of these may validate one config differently (a login
    node and a GPU node sharing a home directory), so a cached validation is keyed by it."""

    devices: DeviceFacts = DeviceFacts()
    modules: tuple[tuple[str, tuple[str, ...]], ...] = ()


def machine_facts() -> MachineFacts:
    return MachineFacts(devices=device_facts(), modules=importable_modules())
