"""`dualpath sweep SPEC.yaml`: a grid of simulations (model x P/D x MaxLen x agents x mode x seed)
-> one table (CSV + JSON) and a plot; serially or as Ray tasks (`--ray`)."""
