"""What only the command line, the tests and the benchmarks load: doctor, probes, hardware
detection, demo, real-vLLM sample factories, CLI. Never imported by the runtime modules vLLM loads
(``tests/project/test_layout.py`` walks their imports)."""
