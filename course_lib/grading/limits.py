"""Start a kernel under resource limits: ``python limits.py MEMORY_BYTES -- KERNEL_COMMAND ...``.

Run as a script (not imported), so the kernel starts as fast as without it. It lowers the limits of
its own process, then replaces itself with the kernel (``os.execv``), which inherits them:
- RLIMIT_AS: the address space; an allocation beyond it fails with a clean error in the cell
  (PyTorch: "DefaultCPUAllocator: can't allocate memory"; NumPy/Python: MemoryError);
- RLIMIT_FSIZE: no single file larger than 1 GB (a cell cannot fill the disk in one file);
- RLIMIT_CORE: no core dumps.
"""

import os
import resource
import sys


def main(argv: list[str]) -> None:
    memory, sep, *command = argv
    if sep != "--" or not command:
        raise SystemExit("usage: limits.py MEMORY_BYTES -- KERNEL_COMMAND ...")
    resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**30, 2**30))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
