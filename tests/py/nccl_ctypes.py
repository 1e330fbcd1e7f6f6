"""Loads a library that calls NCCL with ctypes, as a framework's extension module does: the
library is opened RTLD_LOCAL, so its libnccl.so.2 dependency stays outside the global scope.

Usage: nccl_ctypes.py LIBRARY   (the library exports `int nccl_real_run(void)`)
"""

import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
rc = lib.nccl_real_run()
print(f"nccl_real_run: {rc}", flush=True)
