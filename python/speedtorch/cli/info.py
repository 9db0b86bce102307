"""`python -m speedtorch info`: versions, build, GPUs with their PCIe links, host RAM, and, with a GPU, a quick
measured pinned-copy bandwidth (host<->GPU)."""

from __future__ import annotations

from pathlib import Path

import torch

from .._library import build_info, library_path
from .benchmarking import gbps, median_seconds


def _host_ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _pcie_link(index: int) -> str:
    """PCIe generation and width of GPU `index`, from sysfs or NVML; 'unknown' when neither answers."""
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    domain = getattr(props, "pci_domain_id", 0)
    device = getattr(props, "pci_device_id", 0)
    if bus is not None:
        node = Path(f"/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{device:02x}.0")
        try:
            speed = (node / "current_link_speed").read_text().strip()
            width = (node / "current_link_width").read_text().strip()
            return f"{speed} x{width}"
        except OSError:
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gen = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)
        width = pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
        max_gen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)
        return f"PCIe Gen{gen} x{width} (max Gen{max_gen}; the link may train down when idle)"
    except Exception:  # NVML absent or not permitted: say so rather than guess
        return "unknown"


def _pinned_bandwidth(index: int, nbytes: int = 256 << 20) -> tuple[float, float]:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.fill_(7)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
    h2d = median_seconds(lambda: dev.copy_(host, non_blocking=True), reps=5, warmup=2)
    d2h = median_seconds(lambda: host.copy_(dev, non_blocking=True), reps=5, warmup=2)
    return gbps(nbytes, h2d), gbps(nbytes, d2h)


def report() -> str:
    """What ``python -m speedtorch info`` prints: the library and its build, torch, CPU threads, host RAM, and each GPU
    with its measured pinned-copy bandwidth."""
    lines = [
        f"speedtorch library: {library_path()}",
        f"build:              {build_info()}",
        f"torch:              {torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        f"CPU threads:        {torch.get_num_threads()}",
    ]
    ram = _host_ram_gib()
    lines.append(f"host RAM:           {ram:.1f} GiB" if ram is not None else "host RAM:           unknown")
    if not torch.cuda.is_available():
        lines.append("GPUs:               none (CPU-only: tables stay on the host, ops run on CPU threads)")
        lines.append("pinned copy:        no GPU: no pinned-copy bandwidth to measure")
        return "\n".join(lines)
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        h2d, d2h = _pinned_bandwidth(i)
        lines.append(
            f"GPU {i}:              {props.name}, {props.total_memory / 2**30:.1f} GiB, "
            f"{props.multi_processor_count} SMs, link {_pcie_link(i)}"
        )
        lines.append(f"  pinned copy:      host->GPU {h2d:.1f} GB/s, GPU->host {d2h:.1f} GB/s (256 MiB, median of 5)")
    return "\n".join(lines)
