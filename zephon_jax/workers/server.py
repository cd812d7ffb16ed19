"""What the fork server of the loader's workers loads once, before it forks them.

Where the platform has a fork server (Linux and macOS; see
:func:`~zephon_jax.workers.producer.worker_context`), the loader's workers are not new
interpreters: Python starts one server process the first time a process starts workers,
the server imports this module, and every worker of every loader of that process is
then forked from the server. Importing this module imports the worker's code (the
package, numpy and numba: about 0.7 s) and loads one compiled kernel, which sets up
numba's compiler and its on-disk cache (about 0.7 s more); a worker forked from the
server starts with both done and loads only the kernels its pipeline runs, from the
cache. The server imports neither jax nor the program's modules
(a worker unpickles its dataset, importing what that needs, as a spawned one does).
"""

from __future__ import annotations

from zephon_jax.core.compiled_kernels import warm_up
from zephon_jax.workers import child  # noqa: F401  (the workers' code, imported once)

try:
    warm_up()
except Exception:  # noqa: BLE001  (a server that fails here could fork no worker at all)
    pass  # each worker then sets numba up itself, and reports what fails as it would spawned
