"""Where the runtime's processes run beyond one host's plain processes: emulated hosts on this
machine (testbed/: namespaces, shaped links, the drivers and benchmarks that run on them) and Ray
(ray/: engine actors, the Ray pool that runs simulations as tasks, Ray nodes on the testbed).
Nothing in core/, sim/ or runtime/ imports this package."""
