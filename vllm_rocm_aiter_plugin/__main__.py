import sys

from vllm_rocm_aiter_plugin.cli import main

sys.exit(main())
