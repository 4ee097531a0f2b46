"""dualpath: dual-path KV-cache loading for agentic LLM inference.

Packages: `core` (pure policy and math shared by both worlds), `workloads`, `sim`,
`metrics`, `experiments`. `core` imports nothing from the others.
"""

from ._build import check_fresh

check_fresh()  # refuse compiled simulator modules older than their source (see _build.py)

__version__ = "0.1.0"
