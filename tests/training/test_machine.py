"""The machine a run's figures came from (gmeta_tf.machine), as train_summary.json, eval
results and benchmarks record it."""

from __future__ import annotations

from gmeta_tf.machine import cpu_from_cpuinfo, machine

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
stepping\t: 8
cache size\t: 107520 KB
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni amx_tile

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: another CPU
flags\t\t: fpu sse4_2
"""


def test_first_cpu_named_with_family_model_and_cache_and_its_instruction_sets():
    name, sets = cpu_from_cpuinfo(CPUINFO)
    assert name == ("Intel(R) Xeon(R) Platinum 8480+ (vendor_id GenuineIntel, cpu family 6, "
                    "model 143, stepping 8, cache size 107520 KB)")
    # Only the sets that choose kernels, in a fixed order; the second CPU is not read.
    assert sets == ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "amx_tile"]


ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp sve i8mm bf16
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1

processor\t: 1
Features\t: fp
"""


def test_aarch64_cpu_named_by_implementer_and_part_and_its_instruction_sets():
    name, sets = cpu_from_cpuinfo(ARM_CPUINFO)
    assert name == ("AArch64 (CPU implementer 0x41, CPU architecture 8, CPU variant 0x1, "
                    "CPU part 0xd40, CPU revision 1)")
    assert sets == ["asimd", "asimddp", "sve", "bf16", "i8mm"]


def test_cpuinfo_without_a_model_name_gives_none():
    assert cpu_from_cpuinfo("processor\t: 0\nflags\t: avx2\n") == (None, [])


def test_machine_records_kernel_environment_and_falls_back_without_cpuinfo(tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    record = machine(path)
    assert record["cpu"].startswith("Intel(R) Xeon(R) Platinum 8480+")
    assert record["instruction_sets"][-1] == "amx_tile" and record["cores"] >= 1
    assert record["kernel_environment"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    missing = machine(tmp_path / "absent")  # not Linux: the platform's own name
    assert missing["cpu"] and missing["instruction_sets"] == []
