"""dualpath: dual-path KV-cache loading for agentic LLM inference.

Packages: `core` (pure policy and math shared by both worlds), `workloads`, `sim`,
`metrics`, `experiments`. `core` imports nothing from the others.
"""

from ._build import choose_build

choose_build()  # the compiled simulator where it is fresh, else its sources (see _build.py)

__version__ = "0.1.0"
