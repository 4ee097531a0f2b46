"""`dualpath plan`: which P/D shape and which loading policy for a model, a GPU budget and a workload.

space.py enumerates the configurations a budget allows and the smallest unit each reduces to;
analytic.py estimates every resource's busy time from the cost model (and the paper's
bottleneck-free range) to prune and to name the binding resource; search.py simulates the
survivors at unit scale, with the one scheduler, and ranks them; report.py writes the table,
JSON, plot and the command lines that realise the first choice."""
