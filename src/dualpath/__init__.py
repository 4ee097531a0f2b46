"""dualpath: dual-path KV-cache loading for agentic LLM inference.

Packages: `core` (pure policy and math shared by both worlds), `workloads`, `sim`,
`metrics`, `experiments`. `core` imports nothing from the others.
"""

__version__ = "0.1.0"
