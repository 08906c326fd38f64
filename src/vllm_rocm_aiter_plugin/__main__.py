import sys

from vllm_rocm_aiter_plugin.diagnostics.cli import main

sys.exit(main())
