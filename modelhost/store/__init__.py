"""Model stores: where model directories come from."""
