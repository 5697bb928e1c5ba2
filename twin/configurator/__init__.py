"""`twin configure`: optimum labels, datasets, interpretable configurators, evaluation, search."""
