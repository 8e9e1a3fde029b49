"""python -m nvshmem_efa_gda info|env|paths (the same as the nvshmem-efa-gda command)."""
import sys

from ._cli import main

sys.exit(main())
