"""vLLM's real ROCM_AITER_FA forward on any machine: the cases (:mod:`.cases`), the harness that
runs one step through vLLM's layer and impl (:mod:`.harness`), the references for what needs ROCm
(:mod:`.reference_kernels`) and the runner that judges each request's output (:mod:`.runner`)."""
