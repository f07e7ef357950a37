"""What a run's figures depend on besides its config: the CPU and its instruction sets.

A run is a function of its config and the machine: on one machine it reproduces bit for
bit, but TensorFlow's matrix products go through oneDNN, whose kernels are chosen by the
CPU's instruction set, and their rounding differs (with second-order MAML the fourth
decimal of a cold-start table moves; README, "Running the main job"). So
``train_summary.json``, ``eval/<split>.json`` and the cold-start benchmark's JSON line
carry ``machine()``, and two figures can be told apart by what made them. No TensorFlow here.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The flags oneDNN's kernel choice turns on, as /proc/cpuinfo spells them: x86's "flags"
# line, then AArch64's "Features" line (Advanced SIMD, its dot product, SVE, bf16, int8).
INSTRUCTION_SETS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni",
                    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                    "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm")
# What names an AArch64 CPU, whose /proc/cpuinfo has no model name.
ARM_FIELDS = ("CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision")
# Environment variables that change which kernels run.
KERNEL_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS")


def cpu_from_cpuinfo(text: str) -> tuple[str | None, list[str]]:
    """(a name for the first CPU of a /proc/cpuinfo text, the INSTRUCTION_SETS among its
    flags). The name is its model name with vendor, family, model, stepping and cache size
    (a virtual machine's model name alone is often just "Xeon Processor"); an AArch64 CPU,
    which has none, is named by its implementer, architecture, variant, part and revision."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first CPU's block is enough: every CPU of a machine is alike
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    sets = [s for s in INSTRUCTION_SETS if s in flags]
    if "model name" in fields:
        details = [f"{k} {fields[k]}" for k in ("vendor_id", "cpu family", "model", "stepping",
                                                "cache size") if k in fields]
        return fields["model name"] + (f" ({', '.join(details)})" if details else ""), sets
    if "CPU part" in fields:
        return "AArch64 (" + ", ".join(f"{k} {fields[k]}" for k in ARM_FIELDS
                                      if k in fields) + ")", sets
    return None, []


def machine(cpuinfo: str | Path = "/proc/cpuinfo") -> dict:
    """This process's machine: CPU, its instruction sets (of INSTRUCTION_SETS), cores and
    the kernel-choosing environment variables that are set."""
    try:
        model, sets = cpu_from_cpuinfo(Path(cpuinfo).read_text())
    except OSError:  # not Linux: what the platform module says
        model, sets = None, []
    return {"cpu": model or platform.processor() or platform.machine(),
            "instruction_sets": sets,
            "cores": os.cpu_count(),
            "kernel_environment": {v: os.environ[v] for v in KERNEL_VARIABLES
                                   if v in os.environ}}
