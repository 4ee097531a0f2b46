"""What a user runs on one host's local cluster: `serve`, `run` (trajectory and Mooncake replay),
the demo and its robustness benchmark. The compute profile they are derived from is runtime/profile/;
harnesses (testbed, Ray, chaos) are their own wings (deploy/, chaos/)."""
