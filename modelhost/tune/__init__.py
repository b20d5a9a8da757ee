"""`modelhost tune`: search a model's serving configuration for the most throughput within a p99 budget."""
